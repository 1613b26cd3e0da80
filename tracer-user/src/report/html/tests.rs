//! The page on crafted recordings: hostile names stay text, the data the
//! script reads is the recording's, the CSP admits the page's own script.

use super::*;
use crate::recording::{Frame, FrameKind, StackKind, StackRecord};

const HOSTILE: &str = "</script><script>document.body.dataset.pwned=1</script>\"'<img src=x onerror=alert(1)>\u{202e}\u{1b}[31m";

fn hostile_recording() -> Recording {
    let mut rec = crate::recording::tests::sample();
    rec.sample_hz = 99;
    for t in &mut rec.threads {
        t.comm = HOSTILE.into();
    }
    for t in &mut rec.targets {
        t.comm = HOSTILE.into();
        t.cmdline = vec!["python3".into(), format!("/srv/{HOSTILE}/app.py"), HOSTILE.into()];
    }
    let (pid, tid) = rec.threads.first().map(|t| (t.pid, t.tid)).unwrap_or((1, 1));
    rec.stacks.push(StackRecord {
        kind: StackKind::Cpu,
        reason: None,
        pid,
        tid,
        samples: 5,
        weight_ns: 0,
        syscall: None,
        frames: vec![Frame { function: HOSTILE.into(), file: Some(format!("/srv/{HOSTILE}.py")), line: Some(3), kind: FrameKind::Python, module: None }],
    });
    rec.notes.push(HOSTILE.into());
    rec
}

/// The page's text between `<script` elements of its own, and the data.
fn scripts(page: &str) -> Vec<&str> {
    page.match_indices("<script").map(|(i, _)| &page[i..]).collect()
}

#[test]
fn hostile_names_cannot_leave_their_text() {
    let page = render(&hostile_recording(), Options { source: false });
    assert_eq!(scripts(&page).len(), 2, "only the data and the page's script");
    assert!(!page.contains("<img"), "markup from a name");
    assert!(!page.contains('\u{202e}') && !page.contains('\u{1b}'), "bidi override or escape raw in the page");
    assert!(page.contains("&lt;/script&gt;"), "the name is shown, as text");
    let data = page.split("id=\"infertrace-data\" type=\"application/json\">").nth(1).unwrap().split("</script>").next().unwrap();
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    let names = v["flames"][0]["names"].as_array().unwrap();
    assert!(names.iter().any(|n| n.as_str().unwrap().contains("</script>")), "the data holds the name whole: {names:?}");
}

#[test]
fn the_csp_admits_exactly_the_page_script() {
    let page = render(&hostile_recording(), Options { source: false });
    let hash = script_hash(JS);
    assert!(page.contains(&format!("script-src '{hash}'")));
    assert!(page.contains(&format!("<script>{JS}</script>")), "the hashed text is the script's text");
    assert_eq!(base64(b"any carnal pleas"), "YW55IGNhcm5hbCBwbGVhcw==");
    assert_eq!(base64(b"any carnal pleasu"), "YW55IGNhcm5hbCBwbGVhc3U=");
    assert_eq!(base64(b"any carnal pleasur"), "YW55IGNhcm5hbCBwbGVhc3Vy");
}

#[test]
fn one_row_and_one_bar_per_thread() {
    let rec = hostile_recording();
    let page = render(&rec, Options { source: false });
    assert_eq!(page.matches("<tr class=\"thread\"").count(), rec.threads.len());
    assert_eq!(page.matches("<div class=\"bar\"").count(), rec.threads.len());
}
