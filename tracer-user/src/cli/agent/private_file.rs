//! Files that hold secrets the agent reads at start (`--auth-token-file`,
//! `--tls-key`): one that group or others may read or write is refused (a
//! secret others can read protects nothing), as is anything but a regular
//! file of bounded size. Links are followed (Kubernetes mounts a Secret's
//! keys as links into `..data/`); the mode checked is the target's.

use std::{
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    #[error("cannot read the {what} {path}: {source}")]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("the {what} {path} is accessible to group or others (mode {mode:04o}); chmod 600 it (in Kubernetes: defaultMode: 0400 on the Secret's volume)")]
    Permissions { what: &'static str, path: PathBuf, mode: u32 },
    #[error("the {what} {path} is not a regular file of at most {max} bytes")]
    NotSmallFile { what: &'static str, path: PathBuf, max: u64 },
}

/// The content of `path`, a file only its owner may access, at most `max`
/// bytes. `what` names it in errors ("token file", "TLS key file").
pub fn read(what: &'static str, path: &Path, max: u64) -> Result<Vec<u8>, PrivateFileError> {
    use std::io::Read as _;
    let read_err = |source| PrivateFileError::Read { what, path: path.to_owned(), source };
    // One open, checked through its own descriptor: the file checked is the
    // file read. O_NONBLOCK so that a FIFO put there does not block the open.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    let mode = meta.permissions().mode() & 0o7777;
    if !meta.is_file() || meta.len() > max {
        return Err(PrivateFileError::NotSmallFile { what, path: path.to_owned(), max });
    }
    if mode & 0o077 != 0 {
        return Err(PrivateFileError::Permissions { what, path: path.to_owned(), mode });
    }
    let mut raw = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut raw).map_err(read_err)?;
    if raw.len() as u64 > max {
        return Err(PrivateFileError::NotSmallFile { what, path: path.to_owned(), max });
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_others_can_read_and_what_is_no_small_file() {
        let dir = std::env::temp_dir().join(format!("infertrace-private-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("key");
        std::fs::write(&f, "abc\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = read("TLS key file", &f, 100).expect_err("refused").to_string();
            assert!(e.contains(&format!("mode {mode:04o}")) && e.contains("TLS key file") && e.contains("chmod 600"), "{e}");
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read("TLS key file", &f, 100).unwrap(), b"abc\n");
        // Through a link (a Kubernetes Secret's layout): the target's mode.
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read("TLS key file", &link, 100).unwrap(), b"abc\n");
        let e = read("TLS key file", &f, 3).expect_err("too big").to_string();
        assert!(e.contains("at most 3 bytes"), "{e}");
        let e = read("TLS key file", &dir, 100).expect_err("a directory").to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
