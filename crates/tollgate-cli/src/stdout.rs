//! Command output. `print!` and `eprint!` panic when the reader has gone (`tollgate validate
//! p.yaml | head -1`, `2>&1 | head -1`): on stdout these end the process quietly instead, with
//! status 0, as Unix tools do; on stderr a message that cannot be written is dropped, and the
//! exit status still tells.

use std::io::Write;

/// Writes `args` to stdout; exits at once when stdout is a closed pipe, with status 2 on any
/// other write error.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        errln!("error: cannot write to stdout: {e}");
        std::process::exit(2);
    }
}

/// `print!` that stops quietly when stdout is a closed pipe (see [`write`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write(format_args!($($arg)*)) };
}

/// `println!` that stops quietly when stdout is a closed pipe (see [`write`]).
macro_rules! outln {
    ($($arg:tt)*) => { $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Writes `args` to stderr; a failure to write is ignored (see the module docs).
pub fn write_err(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `eprintln!` that does not panic when stderr is closed or full (see [`write_err`]).
macro_rules! errln {
    ($($arg:tt)*) => { $crate::stdout::write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, out, outln};
