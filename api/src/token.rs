//! Bearer token files of the API's TCP listeners: created at first start, compared in
//! constant time.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Reads the token from `file`, creating the file (mode 0600) with a new random token when
/// it does not exist.
pub fn load_or_create(file: &Path) -> io::Result<String> {
    match std::fs::read_to_string(file) {
        Ok(t) => {
            let t = t.trim().to_string();
            if t.len() < 16 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: the token must be at least 16 characters",
                        file.display()
                    ),
                ));
            }
            Ok(t)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let token = generate();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)?;
            f.write_all(format!("{token}\n").as_bytes())?;
            f.sync_all()?;
            Ok(token)
        }
        Err(e) => Err(e),
    }
}

/// 256 random bits as 64 hex digits.
pub fn generate() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares a presented token with the expected one in time independent of where they
/// differ.
pub fn matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, e) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0) ^ e;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_0600_and_reread() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("api-token");
        let t = load_or_create(&f).unwrap();
        assert_eq!(t.len(), 64);
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_create(&f).unwrap(), t);
        std::fs::write(&f, "short\n").unwrap();
        assert!(load_or_create(&f).is_err());
    }

    #[test]
    fn compare() {
        assert!(matches("abcdef0123456789", "abcdef0123456789"));
        assert!(!matches("abcdef0123456788", "abcdef0123456789"));
        assert!(!matches("abcdef012345678", "abcdef0123456789"));
        assert!(!matches("abcdef01234567890", "abcdef0123456789"));
        assert!(!matches("", "abcdef0123456789"));
        assert_ne!(generate(), generate());
    }
}
