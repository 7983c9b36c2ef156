//! Prints what the Redis store sends Redis: its scripts, its function library and the argument
//! of one request, byte for byte as tollgate builds them, for tools that drive a
//! `redis-server` without tollgate (`scripts/redis-instructions.py` counts the instructions
//! Redis spends per decision with them).
//!
//! ```sh
//! cargo run -q -p tollgate --example redis-lua -- library      # FUNCTION LOAD's argument
//! cargo run -q -p tollgate --example redis-lua -- function     # the name FCALL calls
//! cargo run -q -p tollgate --example redis-lua -- batch        # DECIDE_BATCH for EVALSHA
//! cargo run -q -p tollgate --example redis-lua -- decide       # DECIDE, one unbatched call
//! cargo run -q -p tollgate --example redis-lua -- refund       # REFUND
//! cargo run -q -p tollgate --example redis-lua -- request gcra 1000 1s
//! ```
//!
//! `request ALGORITHM [LIMIT [PERIOD]]` prints DECIDE_BATCH's argument for one request that
//! commits one charge of cost 1 on that limit (default 1000 per `1s`; the period in
//! humantime's format), with the settings of a rule that sets none
//! (`tollgate::store::Charge::new`). The contract of every script is in
//! `tollgate::store::redis::script`.

use std::io::Write;
use std::process::ExitCode;

use tollgate::store::Charge;
use tollgate::store::redis::script;
use tollgate_core::{Algorithm, Params};

const USAGE: &str = "usage: redis-lua (library | function | batch | decide | refund \
                     | request ALGORITHM [LIMIT [PERIOD]])";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redis-lua: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text: Vec<u8> = match args.as_slice() {
        ["library"] => script::decide_batch_library().code.clone().into_bytes(),
        ["function"] => format!("{}\n", script::decide_batch_library().function).into_bytes(),
        ["batch"] => script::DECIDE_BATCH_SCRIPT.into(),
        ["decide"] => script::DECIDE_SCRIPT.into(),
        ["refund"] => script::REFUND_SCRIPT.into(),
        ["request", algorithm, rest @ ..] if rest.len() <= 2 => {
            let algorithm: Algorithm = algorithm.parse()?;
            let limit = rest.first().map_or(Ok(1000), |l| l.parse())?;
            let period = humantime::parse_duration(rest.get(1).copied().unwrap_or("1s"))?;
            let params = Params::new(algorithm, limit, period, None)?;
            let args = script::decide_args(&Charge::new(b"", &params, 1));
            let mut buf = Vec::new();
            script::batch_request_arg(&mut buf, true, [args].iter());
            buf.push(b'\n');
            buf
        }
        _ => return Err(USAGE.into()),
    };
    std::io::stdout().lock().write_all(&text)?;
    Ok(())
}
