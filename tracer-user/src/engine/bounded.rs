//! A list that keeps at most a limit of items and counts the others
//! (the timeline's events, per source): nothing dropped silently.

/// Keeps at most `limit` items, counting the others.
#[derive(Clone, Debug, Default)]
pub struct Bounded<T> {
    pub items: Vec<T>,
    pub limit: u64,
    pub dropped: u64,
}

impl<T> Bounded<T> {
    pub fn new(limit: u64) -> Self {
        Bounded { items: Vec::new(), limit, dropped: 0 }
    }

    pub fn push(&mut self, item: T) {
        if (self.items.len() as u64) < self.limit {
            self.items.push(item);
        } else {
            self.dropped += 1;
        }
    }
}
