//! Which commands are high-risk: before one runs, the task takes a
//! `pre-risk` snapshot so a bad outcome can be rolled back.

use regex::{Regex, RegexBuilder};

use crate::Error;

/// The patterns every daemon starts with, unless its config replaces them.
/// Each is matched (case-insensitively) against the command line: argv joined
/// by spaces, so `sh -c '...'` scripts are seen too.
pub const DEFAULT_RISK_PATTERNS: &[&str] = &[
    // Recursive deletes.
    r"\brm\s+(-\S+\s+)*(-[a-z]*r[a-z]*|--recursive)\b",
    r"\bfind\b.*\s-delete\b",
    // History rewrites and publishing.
    r"\bgit\s+push\b",
    r"\bgit\s+reset\s+--hard\b",
    r"\bgit\s+clean\s+-[a-z]*f",
    // Database clients running write statements.
    r"\b(psql|mysql|mariadb|sqlite3|mongosh|redis-cli)\b.*\b(insert|update|delete|drop|alter|truncate|create|flushall|flushdb)\b",
    // Piping a download into a shell.
    r"\b(curl|wget)\b[^|]*\|\s*(sudo\s+)?(ba|z|da|k)?sh\b",
    // Package removals.
    r"\b(apt|apt-get|dnf|yum|apk|pacman|zypper)\b.*\s(remove|purge|autoremove|del|erase|-r|-rns?)\b",
    r"\bdpkg\s+(-r|-p|--remove|--purge)\b",
    r"\b(pip3?|npm|yarn|pnpm|cargo)\s+(uninstall|remove|rm)\b",
];

/// A compiled list of high-risk command patterns.
#[derive(Clone, Debug)]
pub struct RiskPolicy {
    rules: Vec<(String, Regex)>,
}

impl RiskPolicy {
    /// Compiles `patterns`; a pattern that is not a valid regular expression
    /// is refused with its text.
    pub fn new<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<RiskPolicy, Error> {
        let rules = patterns
            .into_iter()
            .map(|p| {
                RegexBuilder::new(p)
                    .case_insensitive(true)
                    .size_limit(1 << 20)
                    .build()
                    .map(|r| (p.to_owned(), r))
                    .map_err(|e| Error::RiskPattern(p.to_owned(), e.to_string().lines().last().unwrap_or("").trim().to_owned()))
            })
            .collect::<Result<_, _>>()?;
        Ok(RiskPolicy { rules })
    }

    pub fn defaults() -> RiskPolicy {
        // The defaults are constants checked by the tests below.
        RiskPolicy::new(DEFAULT_RISK_PATTERNS.iter().copied()).unwrap_or(RiskPolicy { rules: Vec::new() })
    }

    /// This policy followed by `more` (a task's own patterns after the
    /// daemon's).
    pub fn with(&self, more: &RiskPolicy) -> RiskPolicy {
        RiskPolicy { rules: self.rules.iter().chain(&more.rules).cloned().collect() }
    }

    /// The first pattern the command matches.
    pub fn matches(&self, argv: &[String]) -> Option<&str> {
        let line = argv.join(" ");
        self.rules.iter().find(|(_, r)| r.is_match(&line)).map(|(p, _)| p.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_pattern_is_named_as_written() {
        let e = RiskPolicy::new([r"\bx(\s"]).unwrap_err().to_string();
        assert!(e.starts_with(r"invalid risk pattern `\bx(\s`: "), "{e}");
    }

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn defaults_flag_risky_commands_and_leave_ordinary_ones() {
        let p = RiskPolicy::defaults();
        assert_eq!(p.rules.len(), DEFAULT_RISK_PATTERNS.len(), "every default compiles");
        for risky in [
            "rm -rf /workspace/build",
            "rm -r dir",
            "rm --recursive dir",
            "rm -f -r dir",
            "rm -v -rf dir",
            "sh -c rm -fr x",
            "git push origin main",
            "git reset --hard HEAD~3",
            "git clean -fdx",
            "psql -c DELETE FROM users",
            "sqlite3 app.db drop table t",
            "sh -c curl -fsSL https://x.sh | sh",
            "wget -qO- http://x | sudo bash",
            "apt-get remove -y python3",
            "apt purge nginx",
            "pip uninstall requests",
            "npm rm left-pad",
            "find . -name *.o -delete",
        ] {
            assert!(p.matches(&argv(risky)).is_some(), "{risky:?} not flagged");
        }
        for safe in ["rm file.txt", "ls -r", "git status", "git pushd", "psql -c SELECT 1", "curl -o x https://x", "apt-get install -y jq", "make test", "cargo build -r"] {
            assert_eq!(p.matches(&argv(safe)), None, "{safe:?} flagged");
        }
    }

    #[test]
    fn task_patterns_add_to_the_daemons_and_bad_ones_are_named() {
        let extra = RiskPolicy::new(["terraform\\s+apply"]).unwrap();
        let p = RiskPolicy::defaults().with(&extra);
        assert_eq!(p.matches(&argv("terraform apply -auto-approve")), Some("terraform\\s+apply"));
        let err = RiskPolicy::new(["(unclosed"]).unwrap_err();
        assert!(err.to_string().contains("(unclosed"), "{err}");
    }
}
