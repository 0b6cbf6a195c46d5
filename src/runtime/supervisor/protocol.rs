//! The line protocol between the worker and a command job's supervisor
//! (see [`crate::runtime::supervisor`]): [`Control`] lines from the worker,
//! [`Report`] lines from the supervisor, and how an unreadable line is named
//! without quoting it, since an `env` line carries credentials.

use std::time::Duration;

use serde_json::Value;

/// A line from the worker to the supervisor. Its `Debug` shows the names
/// of an environment's variables, never their values. End of file, when
/// the worker dies or drops its handle, acts as `kill`.
///
/// The protocol runs on a socket pair rather than a pipe on fd 3: it keeps
/// the supervisor free of raw file descriptors (no `unsafe` but the
/// `pre_exec` hook), and lets tests drive it by hand.
#[derive(Clone, PartialEq, Eq)]
pub enum Control {
    /// `env <json>`: the program's whole environment, before the first
    /// renewal. It holds credentials, so no message ever repeats an
    /// unreadable line, only its first word and length ([`describe_line`]).
    Env(Vec<(String, String)>),
    /// `renew <ms>`: the deadline becomes now + ms on the supervisor's
    /// monotonic clock; the first one starts the program.
    Renew(Duration),
    /// `term`: SIGTERM to the program's group.
    Term,
    /// `kill`: SIGKILL to the program's group.
    Kill,
}

impl Control {
    pub fn line(&self) -> String {
        match self {
            // Built as a value so that serialising cannot fail; JSON keeps
            // newlines in values on one line.
            Control::Env(vars) => {
                let pairs = vars
                    .iter()
                    .map(|(k, v)| Value::Array(vec![k.clone().into(), v.clone().into()]))
                    .collect();
                format!("env {}\n", Value::Array(pairs))
            }
            Control::Renew(d) => format!("renew {}\n", d.as_millis()),
            Control::Term => "term\n".into(),
            Control::Kill => "kill\n".into(),
        }
    }

    pub fn parse(line: &str) -> Option<Self> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match (word, rest) {
            ("env", json) => serde_json::from_str(json).ok().map(Control::Env),
            ("renew", ms) => ms
                .parse()
                .ok()
                .map(|ms| Control::Renew(Duration::from_millis(ms))),
            ("term", "") => Some(Control::Term),
            ("kill", "") => Some(Control::Kill),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::Env(vars) => f
                .debug_tuple("Env")
                .field(&vars.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
                .finish(),
            Control::Renew(d) => f.debug_tuple("Renew").field(d).finish(),
            Control::Term => f.write_str("Term"),
            Control::Kill => f.write_str("Kill"),
        }
    }
}

/// An unreadable control line as messages name it: its first word, if that
/// is a short lowercase word, and its length. Never its content, since an
/// `env` line carries the program's credentials.
pub fn describe_line(line: &str) -> String {
    let word = line.split(' ').next().unwrap_or_default();
    if !word.is_empty() && word.len() <= 8 && word.bytes().all(|b| b.is_ascii_lowercase()) {
        format!("`{word} …` ({} bytes)", line.len())
    } else {
        format!("of {} bytes", line.len())
    }
}

/// A line from the supervisor to the worker: `started <pid>` or `failed
/// <errno> <message>`, then, once the program has ended and whatever was
/// left in its group has been SIGKILLed, one of `exit <code>`, `signal <n>`
/// or `expired`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    Started(u32),
    Failed {
        errno: i32,
        message: String,
    },
    Exited(i32),
    Signalled(i32),
    /// Killed because the deadline passed.
    Expired,
}

impl Report {
    pub fn line(&self) -> String {
        match self {
            Report::Started(pid) => format!("started {pid}\n"),
            Report::Failed { errno, message } => {
                format!("failed {errno} {}\n", message.replace(['\n', '\r'], " "))
            }
            Report::Exited(code) => format!("exit {code}\n"),
            Report::Signalled(n) => format!("signal {n}\n"),
            Report::Expired => "expired\n".into(),
        }
    }

    pub fn parse(line: &str) -> Option<Self> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match (word, rest) {
            ("started", pid) => pid.parse().ok().map(Report::Started),
            ("failed", rest) => {
                let (errno, message) = rest.split_once(' ').unwrap_or((rest, ""));
                Some(Report::Failed {
                    errno: errno.parse().ok()?,
                    message: message.to_owned(),
                })
            }
            ("exit", code) => code
                .parse()
                .ok()
                .filter(|c| (0..=255).contains(c))
                .map(Report::Exited),
            ("signal", n) => n
                .parse()
                .ok()
                .filter(|n| (1..=127).contains(n))
                .map(Report::Signalled),
            ("expired", "") => Some(Report::Expired),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_lines_round_trip() {
        for c in [
            Control::Env(vec![
                ("A".into(), "x y\nz".into()),
                ("B".into(), "\"q\"".into()),
            ]),
            Control::Env(vec![]),
            Control::Renew(Duration::from_millis(1500)),
            Control::Term,
            Control::Kill,
        ] {
            let line = c.line();
            assert_eq!(line.matches('\n').count(), 1, "{line:?}");
            assert_eq!(Control::parse(line.trim_end_matches('\n')), Some(c));
        }
        for bad in [
            "",
            "renew",
            "renew -1",
            "renew 1.5",
            "kill now",
            "env {",
            "stop",
        ] {
            assert_eq!(Control::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn environment_values_never_show_in_messages() {
        let secret = "postgres://u:pw-secret@db/batch";
        let env = Control::Env(vec![("DATABASE_URL".into(), secret.into())]);
        assert_eq!(format!("{env:?}"), "Env([\"DATABASE_URL\"])");
        // A line cut short (or otherwise unreadable) is named, not quoted.
        let line = env.line();
        let cut = &line[..line.len() - 4];
        assert_eq!(Control::parse(cut), None);
        let said = describe_line(cut);
        assert!(
            !said.contains("pw-secret") && !said.contains("DATABASE"),
            "{said}"
        );
        assert_eq!(said, format!("`env …` ({} bytes)", cut.len()));
        assert_eq!(describe_line("\u{1b}[2J junk"), "of 9 bytes");
    }

    #[test]
    fn report_lines_round_trip() {
        for r in [
            Report::Started(4242),
            Report::Failed {
                errno: 2,
                message: "No such file or directory (os error 2)".into(),
            },
            Report::Exited(0),
            Report::Exited(255),
            Report::Signalled(9),
            Report::Expired,
        ] {
            assert_eq!(Report::parse(r.line().trim_end_matches('\n')), Some(r));
        }
        let multi = Report::Failed {
            errno: 0,
            message: "two\nlines".into(),
        };
        assert_eq!(multi.line(), "failed 0 two lines\n");
        for bad in [
            "exit 256",
            "exit -1",
            "signal 0",
            "started x",
            "expired now",
            "ok",
        ] {
            assert_eq!(Report::parse(bad), None, "{bad:?}");
        }
    }
}
