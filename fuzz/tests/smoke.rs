//! Every fuzz target over its seed corpus (`seeds/NAME/`) and a fixed set of pseudo-random
//! mutations of it, so that `cargo test --workspace` fails on stable when a parser starts to
//! panic on inputs like the ones libFuzzer starts from.
//!
//! The mutations are deterministic (xorshift seeded from the target's name): bit flips,
//! interesting bytes and integers, truncations, insertions, deletions, duplicated chunks and
//! splices of two seeds, one to four per mutant. `RTGT_FUZZ_SMOKE_MUTANTS` sets the number of
//! mutants per target (default [`DEFAULT_MUTANTS`]). A failing input is written to
//! `CARGO_TARGET_TMPDIR` and printed in hex; `cargo fuzz run NAME FILE` replays it.

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Mutants per target; the whole test takes a few seconds in a debug build.
const DEFAULT_MUTANTS: usize = 10_000;
/// Mutants never grow beyond this.
const MAX_LEN: usize = 64 << 10;
/// Bytes of a failing input printed in hex (the file has all of it).
const MAX_HEX: usize = 1024;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// xorshift64* (Vigna): small, fast, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn new(name: &str) -> Rng {
        // FNV-1a of the name, so every target has its own fixed sequence.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

const INTERESTING_8: &[u8] = &[0, 1, 0x7f, 0x80, 0xff, 0x10, 0x20, 0x40];
const INTERESTING_32: &[u32] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x1ff,
    0x200,
    0x3ff,
    0x1000,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
];

/// Applies one to four mutations to `data`; `other` is another seed to splice with.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + rng.below(4) {
        let len = data.len();
        match rng.below(9) {
            // Flip one bit.
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            // A random or an interesting byte.
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = if rng.below(2) == 0 {
                    rng.byte()
                } else {
                    INTERESTING_8[rng.below(INTERESTING_8.len())]
                };
            }
            // An interesting 16- or 32-bit integer, either byte order (length fields).
            2 if len >= 4 => {
                let v = INTERESTING_32[rng.below(INTERESTING_32.len())];
                let bytes = match rng.below(4) {
                    0 => v.to_be_bytes().to_vec(),
                    1 => v.to_le_bytes().to_vec(),
                    2 => (v as u16).to_be_bytes().to_vec(),
                    _ => (v as u16).to_le_bytes().to_vec(),
                };
                let i = rng.below(len - bytes.len() + 1);
                data[i..i + bytes.len()].copy_from_slice(&bytes);
            }
            // Truncate.
            3 if len > 0 => data.truncate(rng.below(len)),
            // Insert a few random bytes.
            4 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.byte()).collect();
                data.splice(i..i, bytes);
            }
            // Delete a range.
            5 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                data.drain(i..i + n);
            }
            // Duplicate a chunk somewhere else (repeats records and headers).
            6 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(128));
                let chunk = data[i..i + n].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, chunk);
            }
            // Splice: our prefix, the other seed's suffix.
            7 if !other.is_empty() => {
                let i = rng.below(len + 1);
                let j = rng.below(other.len());
                data.truncate(i);
                data.extend_from_slice(&other[j..]);
            }
            // Overwrite a byte with its neighbour's value plus or minus one (off-by-one).
            _ if len > 0 => {
                let i = rng.below(len);
                data[i] = if rng.below(2) == 0 {
                    data[i].wrapping_add(1)
                } else {
                    data[i].wrapping_sub(1)
                };
            }
            _ => data.push(rng.byte()),
        }
    }
    data.truncate(MAX_LEN);
}

/// The seed files of a target, sorted by name.
fn seeds(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = crate_dir().join("seeds").join(name);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), data)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "{} holds no seeds", dir.display());
    out
}

fn mutants() -> usize {
    match std::env::var("RTGT_FUZZ_SMOKE_MUTANTS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("RTGT_FUZZ_SMOKE_MUTANTS={v} is not a number")),
        Err(_) => DEFAULT_MUTANTS,
    }
}

/// Runs `body` on `data`; on a panic, saves the input and fails with where it came from.
fn run_one(name: &str, body: fn(&[u8]), what: &str, data: &[u8]) {
    if panic::catch_unwind(AssertUnwindSafe(|| body(data))).is_ok() {
        return;
    }
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("smoke-{name}-crash"));
    let saved = match std::fs::write(&file, data) {
        Ok(()) => format!("saved to {}", file.display()),
        Err(e) => format!("not saved ({}: {e})", file.display()),
    };
    let hex: String = data
        .iter()
        .take(MAX_HEX)
        .map(|b| format!("{b:02x}"))
        .collect();
    panic!(
        "{name} panicked on {what} ({} bytes, {saved}; replay with \
         `cargo fuzz run {name} --features libfuzzer {}`):\n{hex}{}",
        data.len(),
        file.display(),
        if data.len() > MAX_HEX { "..." } else { "" }
    );
}

/// Every seed of `name`, then the mutants, round robin over the seeds.
fn smoke(name: &str, body: fn(&[u8])) {
    let start = Instant::now();
    let seeds = seeds(name);
    for (file, data) in &seeds {
        run_one(name, body, &format!("seed {file}"), data);
    }
    let mut rng = Rng::new(name);
    let n = mutants();
    for i in 0..n {
        let (file, seed) = &seeds[i % seeds.len()];
        let other = &seeds[rng.below(seeds.len())].1;
        let mut data = seed.clone();
        mutate(&mut rng, &mut data, other);
        run_one(name, body, &format!("mutant {i} of seed {file}"), &data);
    }
    eprintln!(
        "{name}: {} seeds and {n} mutants in {:.2?}",
        seeds.len(),
        start.elapsed()
    );
}

macro_rules! smoke_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                smoke(stringify!($name), rtgt_fuzz::$name);
            }
        )*

        /// The targets this file has a test for.
        const SMOKED: &[&str] = &[$(stringify!($name)),*];
    };
}

smoke_tests!(
    api_http_reply,
    api_lio_import,
    config_yaml,
    iscsi_bhs,
    iscsi_login,
    iscsi_text,
    iser_header,
    nvme_structures,
    nvme_tcp_pdu,
    nvme_tcp_queue,
    scsi_cdb,
    scsi_params,
    scsi_pr_state,
    srp_iu,
    srp_login,
    transport_cm,
    transport_cm_state,
    transport_packet,
    transport_responder,
);

/// Names of the entries of `dir` (files without `ext` are left out when `ext` is given).
fn names_in(dir: &Path, ext: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| match ext {
            Some(ext) => p.extension().is_some_and(|e| e == ext),
            None => p.is_dir(),
        })
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// A target added in one place is added everywhere: its libFuzzer binary and `[[bin]]`, its
/// function in `rtgt_fuzz::TARGETS`, its seeds and its test above.
#[test]
fn every_target_is_wired() {
    let mut listed: Vec<String> = rtgt_fuzz::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    listed.sort();
    let mut smoked: Vec<String> = SMOKED.iter().map(|n| n.to_string()).collect();
    smoked.sort();
    assert_eq!(smoked, listed, "smoke tests vs rtgt_fuzz::TARGETS");
    let binaries = names_in(&crate_dir().join("fuzz_targets"), Some("rs"));
    assert_eq!(binaries, listed, "fuzz_targets/*.rs vs rtgt_fuzz::TARGETS");
    let seed_dirs = names_in(&crate_dir().join("seeds"), None);
    assert_eq!(seed_dirs, listed, "seeds/*/ vs rtgt_fuzz::TARGETS");
    // Every [[bin]] section: its name, its path, and built only with the libfuzzer feature
    // (so that stable builds of the workspace skip it).
    let manifest = std::fs::read_to_string(crate_dir().join("Cargo.toml")).expect("Cargo.toml");
    let mut bins: Vec<String> = Vec::new();
    for section in manifest.split("[[bin]]").skip(1) {
        let section = section.split("\n[").next().unwrap_or_default();
        let lines: Vec<&str> = section.lines().map(str::trim).collect();
        let name = lines
            .iter()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.strip_suffix('"'))
            .unwrap_or_else(|| panic!("a [[bin]] without a name:{section}"));
        let path = format!("path = \"fuzz_targets/{name}.rs\"");
        assert!(
            lines.contains(&path.as_str()),
            "[[bin]] {name} lacks `{path}`"
        );
        let features = "required-features = [\"libfuzzer\"]";
        assert!(
            lines.contains(&features),
            "[[bin]] {name} lacks `{features}`"
        );
        bins.push(name.to_string());
    }
    bins.sort();
    assert_eq!(
        bins, listed,
        "[[bin]] sections of Cargo.toml vs rtgt_fuzz::TARGETS"
    );
}
