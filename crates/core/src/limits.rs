use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Error;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
const TIB: u64 = 1024 * GIB;

/// Resource limits of one task's sandbox.
///
/// `cpus` is kept in thousandths of a CPU so that limits compare exactly and
/// map directly onto a CFS quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Limits {
    pub memory_bytes: u64,
    pub millicpus: u32,
    pub pids: u32,
    pub disk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { memory_bytes: 512 * MIB, millicpus: 1000, pids: 256, disk_bytes: 2 * GIB }
    }
}

impl Limits {
    pub fn set_memory(&mut self, s: &str) -> Result<(), Error> {
        let v = parse_bytes(s).map_err(|_| Error::LimitSize("memory", s.to_owned()))?;
        check_range("memory", s, v, 16 * MIB, TIB, "16M to 1T")?;
        self.memory_bytes = v;
        Ok(())
    }

    pub fn set_cpus(&mut self, s: &str) -> Result<(), Error> {
        let v: f64 = s.trim().parse().map_err(|_| Error::Cpus(s.to_owned()))?;
        if !v.is_finite() || v <= 0.0 {
            return Err(Error::Cpus(s.to_owned()));
        }
        let milli = (v * 1000.0).round();
        if !(10.0..=1_024_000.0).contains(&milli) {
            return Err(Error::LimitRange("cpu", s.to_owned(), "0.01 to 1024"));
        }
        self.millicpus = milli as u32;
        Ok(())
    }

    pub fn set_pids(&mut self, s: &str) -> Result<(), Error> {
        let v: u32 = s.trim().parse().map_err(|_| Error::Pids(s.to_owned()))?;
        if !(8..=4_194_304).contains(&v) {
            return Err(Error::LimitRange("pids", s.to_owned(), "8 to 4194304"));
        }
        self.pids = v;
        Ok(())
    }

    pub fn set_disk(&mut self, s: &str) -> Result<(), Error> {
        let v = parse_bytes(s).map_err(|_| Error::LimitSize("disk", s.to_owned()))?;
        check_range("disk", s, v, 64 * MIB, 16 * TIB, "64M to 16T")?;
        self.disk_bytes = v;
        Ok(())
    }

    /// CPU count as a human would write it (`1`, `0.5`).
    pub fn cpus_display(&self) -> String {
        let whole = self.millicpus / 1000;
        let frac = self.millicpus % 1000;
        if frac == 0 {
            whole.to_string()
        } else {
            format!("{whole}.{frac:03}").trim_end_matches('0').to_owned()
        }
    }
}

fn check_range(what: &'static str, s: &str, v: u64, lo: u64, hi: u64, range: &'static str) -> Result<(), Error> {
    if v < lo || v > hi {
        return Err(Error::LimitRange(what, s.to_owned(), range));
    }
    Ok(())
}

/// Parses a byte size: a whole number with an optional binary unit
/// (`K`, `M`, `G`, `T`, optionally followed by `i` and/or `B`, any case).
/// `512M` is 512 MiB, as in Docker and Kubernetes' `Mi`.
pub fn parse_bytes(s: &str) -> Result<u64, Error> {
    let err = || Error::Size(s.to_owned());
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits_end == 0 {
        return Err(err());
    }
    let n: u64 = t[..digits_end].parse().map_err(|_| err())?;
    let unit = t[digits_end..].to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult = match unit {
        "" => 1,
        "k" => KIB,
        "m" => MIB,
        "g" => GIB,
        "t" => TIB,
        _ => return Err(err()),
    };
    n.checked_mul(mult).ok_or_else(err)
}

/// Parses a duration such as `30s`, `5m`, `1h30m` or `250ms`. A bare number
/// is refused: the unit is never guessed.
pub fn parse_duration(s: &str) -> Result<Duration, Error> {
    humantime::parse_duration(s.trim()).map_err(|_| Error::Duration(s.to_owned()))
}

/// Formats a byte count with the largest binary unit that divides it.
#[derive(Debug)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        for (unit, m) in [("T", TIB), ("G", GIB), ("M", MIB), ("K", KIB)] {
            if v >= m && v.is_multiple_of(m) {
                return write!(f, "{}{unit}", v / m);
            }
        }
        write!(f, "{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("512M"), Ok(512 * MIB));
        assert_eq!(parse_bytes("2G"), Ok(2 * GIB));
        assert_eq!(parse_bytes("2GiB"), Ok(2 * GIB));
        assert_eq!(parse_bytes("64mb"), Ok(64 * MIB));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in ["lots", "", "M", "1.5G", "-1G", "1X", "99999999999999999999T", "12 M"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn limits_are_range_checked() {
        let mut l = Limits::default();
        assert!(l.set_memory("lots").is_err());
        assert!(l.set_memory("1K").is_err());
        assert_eq!(l, Limits::default(), "a refused value changes nothing");
        l.set_memory("1G").unwrap();
        assert_eq!(l.memory_bytes, GIB);
        l.set_cpus("0.5").unwrap();
        assert_eq!((l.millicpus, l.cpus_display().as_str()), (500, "0.5"));
        assert!(l.set_cpus("0").is_err() && l.set_cpus("nan").is_err() && l.set_cpus("-1").is_err());
        assert!(l.set_pids("3").is_err() && l.set_pids("many").is_err());
        l.set_pids("64").unwrap();
        assert!(l.set_disk("1M").is_err());
        l.set_disk("128M").unwrap();
        assert_eq!(l.disk_bytes, 128 * MIB);
    }

    #[test]
    fn units_are_binary() {
        assert_eq!(parse_bytes("1k"), Ok(1024));
        assert_eq!(parse_bytes("1KiB"), Ok(1024));
        assert_eq!(parse_bytes("1M"), Ok(1_048_576));
        assert_eq!(parse_bytes("1G"), Ok(1_073_741_824));
        assert_eq!(parse_bytes("1T"), Ok(1_099_511_627_776));
        assert_eq!(parse_bytes("3tb"), Ok(3_298_534_883_328));
        assert_eq!(parse_bytes("16777215T"), Ok(u64::MAX - (1 << 40) + 1));
        assert_eq!(parse_bytes("16777216T"), Err(Error::Size("16777216T".into())), "2^64 bytes overflow");
    }

    #[test]
    fn limits_take_both_ends_of_their_range_and_nothing_past_them() {
        let mut l = Limits::default();
        let range = |what, s: &str, r| Err(Error::LimitRange(what, s.to_owned(), r));
        assert_eq!(l.set_memory("16M"), Ok(()));
        assert_eq!(l.memory_bytes, 16_777_216);
        assert_eq!(l.set_memory("16777215"), range("memory", "16777215", "16M to 1T"));
        assert_eq!(l.set_memory("1T"), Ok(()));
        assert_eq!(l.memory_bytes, 1_099_511_627_776);
        assert_eq!(l.set_memory("1099511627777"), range("memory", "1099511627777", "16M to 1T"));
        assert_eq!(l.set_disk("64M"), Ok(()));
        assert_eq!(l.disk_bytes, 67_108_864);
        assert_eq!(l.set_disk("67108863"), range("disk", "67108863", "64M to 16T"));
        assert_eq!(l.set_disk("16T"), Ok(()));
        assert_eq!(l.disk_bytes, 17_592_186_044_416);
        assert_eq!(l.set_disk("17592186044417"), range("disk", "17592186044417", "64M to 16T"));
        assert_eq!(l.set_pids("8"), Ok(()));
        assert_eq!(l.set_pids("4194304"), Ok(()));
        assert_eq!(l.set_pids("7"), range("pids", "7", "8 to 4194304"));
        assert_eq!(l.set_pids("4194305"), range("pids", "4194305", "8 to 4194304"));
        assert_eq!(l.set_cpus("0.01"), Ok(()));
        assert_eq!(l.set_cpus("1024"), Ok(()));
        assert_eq!(l.millicpus, 1_024_000);
        assert_eq!(l.set_cpus("1024.001"), range("cpu", "1024.001", "0.01 to 1024"));
        assert_eq!(l.set_cpus("0.004"), range("cpu", "0.004", "0.01 to 1024"));
        // Not a positive finite number: the value is wrong, not its range.
        for bad in ["0", "-1", "-0.5", "inf", "-inf", "NaN", "x"] {
            assert_eq!(l.set_cpus(bad), Err(Error::Cpus(bad.to_owned())), "{bad:?}");
        }
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(Bytes(512 * MIB).to_string(), "512M");
        assert_eq!(Bytes(2 * GIB).to_string(), "2G");
        assert_eq!(Bytes(1000).to_string(), "1000");
        assert_eq!(Bytes(0).to_string(), "0");
        assert_eq!(Bytes(1536).to_string(), "1536", "1.5K is not a whole K");
        assert_eq!(Bytes(3 * 1024 * 1024 + 1024).to_string(), "3073K");
    }
}
