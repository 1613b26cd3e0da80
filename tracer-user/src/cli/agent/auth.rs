//! `--auth-token-file`: the bearer token the agent's HTTP endpoints require
//! (`http`). The file is read once, at start; one that group or others may
//! read or write is refused (a token others can read protects nothing).
//! Requests are compared in constant time (in the presented token's length).

use std::{path::{Path, PathBuf}, sync::Arc};

/// The longest token accepted.
const MAX_LEN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    File(#[from] super::private_file::PrivateFileError),
    #[error("the token file {path} {why}")]
    Content { path: PathBuf, why: &'static str },
}

#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl Token {
    /// Reads the token: the file's content without surrounding whitespace,
    /// printable ASCII (what an `Authorization` header can carry).
    pub fn from_file(path: &Path) -> Result<Token, AuthError> {
        let raw = super::private_file::read("token file", path, MAX_LEN as u64 + 64)?;
        Token::parse(&raw).map_err(|why| AuthError::Content { path: path.to_owned(), why })
    }

    fn parse(raw: &[u8]) -> Result<Token, &'static str> {
        let t = raw.trim_ascii();
        if t.is_empty() {
            return Err("is empty");
        }
        if t.len() > MAX_LEN || !t.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err("must hold one token of printable ASCII without spaces (at most 4096 bytes)");
        }
        Ok(Token(t.into()))
    }

    /// Whether `presented` is the token; the time taken depends only on
    /// the presented token's length.
    pub fn matches(&self, presented: &str) -> bool {
        let p = presented.as_bytes();
        let mut diff = p.len() ^ self.0.len();
        for (i, &b) in p.iter().enumerate() {
            diff |= usize::from(b ^ self.0.get(i).copied().unwrap_or(0));
        }
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_token() {
        let t = Token::parse(b"  s3cr3t-t0ken\n").unwrap();
        assert!(t.matches("s3cr3t-t0ken"));
        assert!(!t.matches("s3cr3t-t0ke"));
        assert!(!t.matches("s3cr3t-t0ken!"));
        assert!(!t.matches("S3cr3t-t0ken"));
        assert!(!t.matches(""));
    }

    #[test]
    fn refuses_empty_or_spaced_tokens() {
        assert!(Token::parse(b"\n").is_err());
        assert!(Token::parse(b"two words").is_err());
    }

    #[test]
    fn refuses_a_file_others_can_read() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("infertrace-auth-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "abc\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Token::from_file(&f).err().expect("0644 refused").to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Token::from_file(&f).unwrap().matches("abc"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
