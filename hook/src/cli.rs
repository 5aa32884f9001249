//! The hook's command line, as the CDI spec writes it (`engine.cdi.hook_command`):
//!
//! ```text
//! nri-gpu-hook start-container [--time-limit SECONDS] --work JSON
//! ```
//!
//! with the OCI state on stdin. Everything comes from the arguments: no config
//! file, no environment. The hook bounds its own run (`--time-limit`), reads at
//! most `STATE_LIMIT` + 1 bytes of stdin and `CONFIG_LIMIT` + 1 of the bundle's
//! `config.json`. Exit codes: 0 done, 1 refused (the message says why), 2 usage.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::error::py_repr;
use crate::json::{self, Value};
use crate::start::{perform_in_bundle, StepFailed};
use crate::sys;
use crate::work::{read_bundle, read_description, start_work, BadInput};

pub const STATE_LIMIT: u64 = 1 << 20;
pub const CONFIG_LIMIT: u64 = 16 << 20;
/// The work description (one argument: the kernel's limit for one is 128 KiB).
pub const WORK_LIMIT: usize = 128 << 10;
/// Seconds the hook gives its own run unless told (`engine.cdi.HOOK_TIME_LIMIT`).
pub const TIME_LIMIT: f64 = 10.0;
/// The start work's deadline comes this long before the process's own limit: its
/// own bounds then report the step, not the bare limit.
const WORK_MARGIN: f64 = 1.0;
const MAX_DEPTH: usize = 64;
const USAGE: &str = "usage: nri-gpu-hook start-container [--time-limit SECONDS] --work JSON\n\n\
    The CDI spec's createContainer hook of nri-gpu (written by `nri-gpu cdi generate`):\n\
    the container-start work, with the OCI state on stdin.\n";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub struct Args {
    pub time_limit: f64,
    pub work: String,
}

/// The arguments after argv[0]; `Err((status, message))` for help (0) and mistakes (2).
pub fn parse_args(words: &[String]) -> Result<Args, (i32, String)> {
    if words.iter().any(|w| w == "-h" || w == "--help") {
        return Err((0, USAGE.to_string()));
    }
    let usage = |problem: String| Err((2, format!("{}nri-gpu-hook: error: {}\n", USAGE, problem)));
    match words.first() {
        Some(action) if action == "start-container" => {}
        Some(other) => return usage(format!("unknown action {} (expected start-container)", py_repr(other))),
        None => return usage("an action is required (start-container)".to_string()),
    }
    let mut time_limit = None;
    let mut work = None;
    let mut rest = words[1..].iter();
    while let Some(flag) = rest.next() {
        let value = match rest.next() {
            Some(value) => value,
            None => return usage(format!("{} needs a value", flag)),
        };
        match flag.as_str() {
            "--time-limit" if time_limit.is_none() => match value.parse::<f64>() {
                Ok(seconds) if seconds > 0.0 && seconds <= 3600.0 => time_limit = Some(seconds),
                _ => {
                    return usage(format!(
                        "argument --time-limit: {} is not a number of seconds between 0 and 3600",
                        py_repr(value)
                    ))
                }
            },
            "--work" if work.is_none() => {
                if value.len() > WORK_LIMIT {
                    return usage(format!("argument --work: over {} bytes", WORK_LIMIT));
                }
                work = Some(value.clone());
            }
            _ => return usage(format!("unrecognized or repeated argument {}", py_repr(flag))),
        }
    }
    match work {
        Some(work) => Ok(Args { time_limit: time_limit.unwrap_or(TIME_LIMIT), work }),
        None => usage("the argument --work is required".to_string()),
    }
}

/// Run the hook: the process's exit status; messages go to stderr.
pub fn main_with(words: &[String]) -> i32 {
    let args = match parse_args(words) {
        Ok(args) => args,
        Err((status, text)) => {
            if status == 0 {
                print!("{}", text);
            } else {
                eprint!("{}", text);
            }
            return status;
        }
    };
    // First: whatever follows may block (a stdin that never closes, a stuck file system).
    let expired = format!(
        "nri-gpu hook: did not finish within its time limit of {} s; giving up\n",
        python_float(args.time_limit)
    );
    if let Err(e) = sys::exit_after(args.time_limit, &expired) {
        eprintln!("nri-gpu hook: cannot set its time limit: {}", sys::error_text(&e));
        return 1;
    }
    let margin = (args.time_limit - WORK_MARGIN).max(args.time_limit / 2.0);
    let deadline = Instant::now() + Duration::from_secs_f64(margin);
    let description = match json::parse(args.work.as_bytes(), MAX_DEPTH)
        .map_err(|e| BadInput(format!("the work description is not JSON: {}", e)))
        .and_then(|value| read_description(&value))
    {
        Ok(description) => description,
        Err(BadInput(problem)) => {
            eprintln!("nri-gpu hook: --work: {}", problem);
            return 2;
        }
    };
    // runc starts the hook in the container's bundle; nothing of ours is looked up there.
    let _ = std::env::set_current_dir("/");
    match run(&description, deadline) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("nri-gpu hook: {}", message);
            1
        }
    }
}

fn run(description: &crate::work::Description, deadline: Instant) -> Result<(), String> {
    // Read without a buffer (std's stdin reads ahead).
    let state =
        sys::read_up_to(0, STATE_LIMIT + 1).map_err(|e| format!("the OCI state on stdin: {}", sys::error_text(&e)))?;
    let state = json_object(&state, "the OCI state on stdin", STATE_LIMIT)?;
    let id = match state.get("id") {
        Some(Value::Str(id)) if !id.is_empty() => id.clone(),
        other => return Err(format!("the OCI state has no container id (id: {})", python_repr(other))),
    };
    let bundle = match state.get("bundle") {
        Some(Value::Str(path)) if path.starts_with('/') => path.clone(),
        other => return Err(format!("the OCI state's bundle {} is not an absolute path", python_repr(other))),
    };
    let config = read_config(&bundle)?;
    let parsed = read_bundle(&config, &bundle).map_err(|BadInput(problem)| problem)?;
    let rootfs = normpath(&if parsed.root_path.starts_with('/') {
        parsed.root_path.clone()
    } else {
        format!("{}/{}", bundle, parsed.root_path)
    });
    let who = format!("container {}", id);
    let work = start_work(description, &parsed, &who);
    perform_in_bundle(&rootfs, &work, deadline)
        .map_err(|StepFailed { step, message }| format!("{}: {}: {}", who, step, message))
}

fn read_config(bundle: &str) -> Result<Value, String> {
    let path = format!("{}/config.json", bundle);
    let mut data = Vec::new();
    std::fs::File::open(&path)
        .and_then(|file| file.take(CONFIG_LIMIT + 1).read_to_end(&mut data))
        .map_err(|e| format!("{}: {}", path, sys::error_text(&e)))?;
    json_object(&data, &path, CONFIG_LIMIT)
}

/// `data` as a JSON object of at most `limit` bytes; the message names `what`.
fn json_object(data: &[u8], what: &str, limit: u64) -> Result<Value, String> {
    if data.len() as u64 > limit {
        return Err(format!("{} is over {} bytes", what, limit));
    }
    let value = json::parse(data, MAX_DEPTH).map_err(|e| format!("{} is not JSON: {}", what, e))?;
    if value.as_object().is_none() {
        return Err(format!("{} is not a JSON object", what));
    }
    Ok(value)
}

/// Python's repr of a JSON value, for the messages that quote one.
fn python_repr(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "None".to_string(),
        Some(Value::Bool(b)) => if *b { "True" } else { "False" }.to_string(),
        Some(Value::Int(n)) => n.to_string(),
        Some(Value::Float(f)) => python_float(*f),
        Some(Value::Str(s)) => py_repr(s),
        Some(Value::Array(_)) => "[...]".to_string(),
        Some(Value::Object(_)) => "{...}".to_string(),
    }
}

/// A float as Python's `:g` shows the time limit (`10`, `0.5`).
fn python_float(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{}", value)
    }
}

/// `posixpath.normpath` of an absolute path: `//`, `.` and `..` resolved lexically.
pub fn normpath(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_specs_command_line() {
        let args = parse_args(&words("start-container --time-limit 2.5 --work {}")).unwrap();
        assert_eq!(args, Args { time_limit: 2.5, work: "{}".into() });
        assert_eq!(parse_args(&words("start-container --work {}")).unwrap().time_limit, TIME_LIMIT);
    }

    #[test]
    fn mistakes_are_usage_errors() {
        for bad in [
            "",
            "stop-container --work {}",
            "start-container",
            "start-container --work",
            "start-container --work {} --work {}",
            "start-container --time-limit 0 --work {}",
            "start-container --time-limit nan --work {}",
            "start-container --time-limit 4000 --work {}",
            "start-container --other x --work {}",
        ] {
            let found = parse_args(&words(bad).into_iter().filter(|w| !w.is_empty()).collect::<Vec<_>>());
            assert_eq!(found.map_err(|(status, _)| status), Err(2), "{:?}", bad);
        }
        assert_eq!(parse_args(&words("--help")).map_err(|(s, _)| s), Err(0));
    }

    #[test]
    fn normpath_is_pythons() {
        assert_eq!(normpath("/b/./rootfs"), "/b/rootfs");
        assert_eq!(normpath("/b//x/../rootfs/"), "/b/rootfs");
        assert_eq!(normpath("/../x"), "/x");
    }

    #[test]
    fn floats_as_python_shows_them() {
        assert_eq!(python_float(10.0), "10");
        assert_eq!(python_float(0.5), "0.5");
    }
}
