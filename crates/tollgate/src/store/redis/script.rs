//! The Lua twins of the core algorithms, assembled into the three scripts the Redis store runs.
//!
//! Each algorithm of `tollgate-core` has one Lua twin in `lua/` that gives identical decisions
//! (verdict, remaining, reset_after, retry_after, delay, in integer microseconds) for any
//! sequence of requests; `tests/store/lua_twin.rs` checks that on a real `redis-server`. The files are
//! concatenated at compile time: helpers first (`exact.lua`), then the twins, the per-key state
//! (`state.lua`), then the one-request decision (`decide.lua`) and a driver (`decide_one.lua`,
//! `decide_batch.lua` or `refund.lua`).
//!
//! # DECIDE ([`DECIDE_SCRIPT`])
//!
//! One call per request covers all of its limits (on a cluster: all of them on one slot).
//!
//! - `KEYS[i]`: the counter key of charge `i`. All keys share a hash slot; the same key may
//!   appear more than once; no undeclared key is touched.
//! - `ARGV[1]`: `"1"` commits if admitted, `"0"` decides only and never writes.
//! - `ARGV[2]`: `now` in microseconds since the epoch (tests), `""` for the server's `TIME`, or
//!   `"<D"` for the server's `TIME` when the call may write only until server instant `D`
//!   (microseconds): run later, it writes nothing and answers the error `tollgate: late` (see
//!   `now`: a caller that has given up must not be charged). Must be below [`MAX_NOW_MICROS`].
//! - then 6 per charge, from `ARGV[3 + 6 * (i - 1)]` ([`decide_args`]): [`algorithm_code`],
//!   limit, period in microseconds, burst, cost (0: a check, which charges nothing), flags (1
//!   enforced, plus 2 when the limit charges up to the limit: a charge that does not fit whole
//!   is decided again for what is left, as `tollgate_core::decide` does; plus 4 for a quota-mode
//!   charge; plus 8 when a check (a cost of 0) answers as the counter stands,
//!   `tollgate_core::check_as_is`, rather than as a cost of 1 would).
//!
//! Every charge is decided against the current state; charges on the same key are decided in
//! order, each seeing the tentative effect of the earlier ones. The call is admitted when every
//! enforced charge without quota mode is allowed and, when there are quota-mode charges, at
//! least one of them is allowed or not enforced (`store::admitted`); then (with `ARGV[1] == "1"`) every allowed charge is committed,
//! denied ones consume nothing; otherwise nothing is written. All reads happen before the first
//! write, so a key holding a foreign Redis type fails the call (`WRONGTYPE`) with every key
//! unchanged. Every key written gets `PEXPIREAT ceil(expires_at / 1000)` ms, `expires_at` being
//! [`tollgate_core::State::expires_at`] of its new state; a state already expired at `now` is
//! deleted instead.
//!
//! Reply: a flat integer array `[now_us, admitted (1/0)]`, then per charge `verdict` (0
//! allowed, 1 denied, 2 cost exceeds capacity), `remaining`, `reset_after_us`,
//! `retry_after_us` (-1 when none), `delay_us`, `charged` (the units an allowed charge takes:
//! its cost, or what was left when it charges up to the limit; 0 for a check or a denial),
//! which is what a refund gives back.
//!
//! # DECIDE_BATCH ([`DECIDE_BATCH_SCRIPT`])
//!
//! Several requests in one call (single Redis server only: the coalescer batches concurrent
//! decisions, see `coalesce`). Each is decided exactly as one DECIDE call would, in order, all
//! at one `now`; the script being atomic, the batch is the same as those calls back to back.
//!
//! - `ARGV[1]`: `now` as for DECIDE.
//! - then one per request ([`batch_request_arg`]): its words separated by single spaces,
//!   commit (`1` / `0`), `n` (its charges), then 6 per charge as above. `KEYS` holds the
//!   requests' keys back to back.
//!
//! Reply: one flat array holding the call's `now_us`, then per request in order its DECIDE
//! reply (`2 + 6 * n` integers); or `-1` and a message for a request that raised an error (a
//! foreign value at one of its keys, or the whole batch past its `"<D"`), which wrote nothing
//! (all its reads come before its writes) while the requests after it are decided normally;
//! or, for the common answer (one charge, admitted and allowed, no retry, no delay), `-2`,
//! `remaining`, `reset_after_us`, `charged`, which stands for `now_us, 1, 0, remaining,
//! reset_after_us, -1, 0, charged`: [`split_batch_reply`].
//!
//! On Redis 7 and later the coalescer calls the same code as a function
//! ([`decide_batch_library`], `FCALL`), with the same arguments and reply; `EVALSHA` of
//! [`DECIDE_BATCH_SCRIPT`] where functions are refused.
//!
//! One argument per request, one array per batch and the short form, because Redis's own
//! handling of a script's arguments and reply arrays cost more than the script's decisions
//! (see docs/benchmarks.md, "Redis path").
//!
//! # REFUND ([`REFUND_SCRIPT`])
//!
//! Takes back charges a DECIDE call committed, for a cluster request whose other slot denied,
//! and a lease's unused units. Its Rust twin is `tollgate_core::refund`, plus the rule on a key
//! made after the charge, which the memory store follows as well.
//!
//! - `KEYS`: the keys to refund. `ARGV[1]`: the `now_us` the DECIDE call answered.
//! - then 5 per key, from `ARGV[2 + 5 * (i - 1)]`: algorithm code, limit, period, burst, cost.
//!
//! Undoes one charge of `cost` made at that instant: exactly when nothing else touched the key
//! since (later decisions are those of a key that never saw the charge), conservatively
//! otherwise. Fixed window and sliding counter decrement the window the charge landed in (the
//! counter's previous window once it has rolled, nothing if older); the sliding log takes
//! `cost` back from its entries at that instant; the token bucket gets its tokens back, capped
//! at burst; GCRA and the leaky bucket move their time back by `cost * period / limit`, never
//! before the charge instant; a bucket written under another limit or period than the
//! refund's (a reload converted it since) is left alone. TTLs follow the new state. Replies the
//! number of distinct keys whose state changed.
//!
//! # Storage
//!
//! - Sliding log: a ZSET, score = admission time (µs), member = `"%016d:%d"` of `(S, cost)`
//!   where `S` is the total cost of the entries before it, so a decision reads two entries (a
//!   denial of a weighted request: a binary search by rank), not the whole log. Entries of one
//!   call are stored as one entry; `S` restarts at 0 when the log empties or passes 2^50.
//! - Every other algorithm: a hash, `t` = algorithm code, then `x`, `y`, `z`:
//!   fixed window `x` = window index, `y` = count; sliding counter `x` = window, `y` = current,
//!   `z` = previous; token bucket `x` = updated (µs), `y`,`z` = the instant the bucket is full
//!   again; leaky bucket `x`,`y` = the instant the queue is empty; GCRA `x`,`y` = the
//!   theoretical arrival time. An instant is a pair `(w, f)` = `w * limit + f` in Rust's scaled
//!   units (`micros * limit`), `0 <= f < limit`. The leaky bucket's and GCRA's `z` is when they
//!   were written (µs). The buckets' `l` and `p` are the limit and period they were written
//!   under, which a decision under other params converts them from (see "When the params
//!   change" in `tollgate_core::State`); a bucket written before they were recorded has none and
//!   is read as written under the current params. The windows' `p` is the period they were
//!   written under, which with their fields gives their TTL: a write that leaves the expiry
//!   where it was (a count within its window; a bucket within the same millisecond) sends no
//!   `PEXPIREAT`, and one that leaves a field's text unchanged does not write it (a window
//!   hash written before `p` was recorded gets a `PEXPIREAT` and its `p` on its next write).
//!   `b` is the instant (µs) the hash was
//!   made, written once: REFUND leaves a hash made after the charge it undoes alone (Redis lost
//!   the counter charged, say a `FLUSHALL` before a local budget's give-back, and a new one was
//!   made since; a clock stepped back in between drops the refund too, conservatively).
//!   Every write leaves both `b` and `p` in the hash, so a hash that holds `p` holds `b`: a
//!   one-charge decision reads `p` and not `b`, and decides a hash with `t` but no `p` (older
//!   than both) the long way, which reads `b`.
//!
//! A hash of another algorithm, or a ZSET read by a hash algorithm (and the other way round),
//! is an empty state, as in Rust (a policy that switches a live key's algorithm).
//!
//! # Where the scripts and the core may differ
//!
//! - Params changed on a live key: none. Every algorithm keeps the units used, exactly as the
//!   core does (the windows and the log their counts, the buckets their units used when last
//!   written, converted through the period and capped at the new burst). The TTL a key was
//!   given under its old params stands, on either store (see `tollgate_core::State`). REFUND
//!   leaves a bucket written under another limit or period than the refund's alone.
//! - `now` at or past [`MAX_NOW_MICROS`] is an error, and a bucket whose refill time fails
//!   [`fits_lua`] must not reach the script.
//! - A state that has expired when written is deleted: the same from then on (the core's
//!   contract), but if the clock later runs backwards past that instant the script sees an empty
//!   key where the memory store still holds the old state.
//!
//! Redis expires keys by its own wall clock: tests that pin `now` must pin it in the future, or
//! the keys the script writes vanish at once.

use tollgate_core::{Algorithm, Params};

use crate::store::Charge;

/// The helpers, the twins and the per-key state, then `$driver`: one script.
macro_rules! script {
    ($($driver:literal),+) => {
        concat!(
            include_str!("lua/exact.lua"),
            include_str!("lua/fixed_window.lua"),
            include_str!("lua/sliding_window_counter.lua"),
            include_str!("lua/gcra.lua"),
            include_str!("lua/token_bucket.lua"),
            include_str!("lua/leaky_bucket.lua"),
            include_str!("lua/sliding_window_log.lua"),
            include_str!("lua/state.lua"),
            $(include_str!($driver)),+
        )
    };
}

/// The DECIDE script. See the [module documentation](self) for its contract.
pub const DECIDE_SCRIPT: &str = script!("lua/decide.lua", "lua/decide_one.lua");

/// The DECIDE_BATCH script. See the [module documentation](self) for its contract.
pub const DECIDE_BATCH_SCRIPT: &str = script!(
    "lua/decide.lua",
    "lua/decide_batch.lua",
    "lua/decide_batch_eval.lua"
);

/// DECIDE_BATCH's code without its caller: defines `decide_batch(keys, argv)`.
const DECIDE_BATCH_BODY: &str = script!("lua/decide.lua", "lua/decide_batch.lua");

/// DECIDE_BATCH as a Redis function library (Redis 7 and later), called with `FCALL`: Redis
/// runs a script's whole body on every `EVALSHA` call (for this one, ~70,000 instructions of
/// defining its functions before the first decision), a library's body once, when it loads.
/// Same arguments, same reply.
#[derive(Debug)]
pub struct FunctionLibrary {
    /// The function to `FCALL`, `tollgate_decide_batch_` and the SHA-1 of the code.
    pub function: String,
    /// What `FUNCTION LOAD` takes: the library named `tollgate_` and the same SHA-1, one per
    /// version of the script, so that servers of two versions sharing a Redis each call their
    /// own.
    pub code: String,
}

/// The DECIDE_BATCH function library. See [`FunctionLibrary`].
pub fn decide_batch_library() -> &'static FunctionLibrary {
    static LIBRARY: std::sync::LazyLock<FunctionLibrary> = std::sync::LazyLock::new(|| {
        let hash = redis::Script::new(DECIDE_BATCH_BODY).get_hash().to_owned();
        let function = format!("tollgate_decide_batch_{hash}");
        FunctionLibrary {
            code: format!(
                "#!lua name=tollgate_{hash}\n{DECIDE_BATCH_BODY}\n\
                 redis.register_function('{function}', decide_batch)\n"
            ),
            function,
        }
    });
    &LIBRARY
}

/// The REFUND script. See the [module documentation](self) for its contract.
pub const REFUND_SCRIPT: &str = script!("lua/refund.lua");

/// The five numbers that describe a charge to every script: algorithm code, limit, period in
/// microseconds, burst and cost.
pub fn charge_args(params: &Params, cost: u64) -> [u64; 5] {
    [
        u64::from(algorithm_code(params.algorithm())),
        params.limit(),
        params.period_micros(),
        params.burst(),
        cost,
    ]
}

/// The six numbers that describe a charge to DECIDE: its [`charge_args`], then its flags, 1
/// when it is enforced, plus 2 when its limit charges up to the limit, plus 4 when it is a
/// quota-mode charge ([`Charge::quota`]), plus 8 when a check (a cost of 0) answers as the
/// counter stands ([`Charge::checks_as_is`]).
///
/// The 8 is sent for a check only: it means nothing to a charge of a cost. The script's
/// one-charge path declined it until its plan learnt to ignore it there, so every gRPC charge
/// (its requests check as the counter stands) took the general path, about twice the Redis time
/// a decision; `tests/store/redis_plan.rs` watches which path a request takes.
pub fn decide_args(charge: &Charge<'_>) -> [u64; 6] {
    let [algorithm, limit, period, burst, cost] = charge_args(charge.params, charge.cost);
    let flags = u64::from(charge.enforce)
        | u64::from(charge.params.charges_up_to_limit()) << 1
        | u64::from(charge.quota) << 2
        | u64::from(charge.checks_as_is && cost == 0) << 3;
    [algorithm, limit, period, burst, cost, flags]
}

/// Appends DECIDE_BATCH's argument for one request to `buf`: `commit`, then the number of its
/// charges, then each charge's [`decide_args`], in decimal, separated by single spaces.
pub fn batch_request_arg<'a>(
    buf: &mut Vec<u8>,
    commit: bool,
    charges: impl ExactSizeIterator<Item = &'a [u64; 6]>,
) {
    let mut decimal = itoa::Buffer::new();
    buf.push(if commit { b'1' } else { b'0' });
    buf.push(b' ');
    buf.extend_from_slice(decimal.format(charges.len()).as_bytes());
    for args in charges {
        for &v in args {
            buf.push(b' ');
            buf.extend_from_slice(decimal.format(v).as_bytes());
        }
    }
}

/// Splits a DECIDE_BATCH reply into each request's DECIDE reply (a short form written out in
/// full), or the message its error raised; `charges` gives each request's number of charges,
/// in order. `None` when the reply does not hold exactly that.
pub fn split_batch_reply(
    reply: &[redis::Value],
    charges: impl IntoIterator<Item = usize>,
) -> Option<Vec<Result<Vec<i64>, String>>> {
    use redis::Value;
    let [Value::Int(now), requests @ ..] = reply else {
        return None;
    };
    let mut rest = requests;
    let mut replies = Vec::new();
    for n in charges {
        if let [Value::Int(-2), short @ ..] = rest {
            let [
                Value::Int(remaining),
                Value::Int(reset),
                Value::Int(charged),
                tail @ ..,
            ] = short
            else {
                return None;
            };
            if n != 1 {
                return None;
            }
            replies.push(Ok(vec![*now, 1, 0, *remaining, *reset, -1, 0, *charged]));
            rest = tail;
            continue;
        }
        if let [Value::Int(-1), message, tail @ ..] = rest {
            let message = match message {
                Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                Value::SimpleString(text) => text.clone(),
                _ => return None,
            };
            replies.push(Err(message));
            rest = tail;
            continue;
        }
        let len = 2 + 6 * n;
        if rest.len() < len {
            return None;
        }
        let (this, tail) = rest.split_at(len);
        let numbers = this
            .iter()
            .map(|v| match v {
                Value::Int(i) => Some(*i),
                _ => None,
            })
            .collect::<Option<Vec<i64>>>()?;
        replies.push(Ok(numbers));
        rest = tail;
    }
    rest.is_empty().then_some(replies)
}

/// The scripts refuse a `now` at or past this (2^52 µs, in the year 2112): every instant they
/// form must stay below 2^53 to be exact in a Lua double.
pub const MAX_NOW_MICROS: u64 = 1 << 52;

/// The longest time a bucket algorithm may take to refill (drain) a whole burst:
/// `burst * period / limit`, 2^50 µs (about 35.7 years).
pub const MAX_REFILL_MICROS: u64 = 1 << 50;

/// The code an algorithm has in the scripts' arguments and in the stored hashes.
pub fn algorithm_code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindowLog => 2,
        Algorithm::SlidingWindowCounter => 3,
        Algorithm::TokenBucket => 4,
        Algorithm::LeakyBucket => 5,
        Algorithm::Gcra => 6,
    }
}

/// Whether the scripts decide `params` exactly like the core.
///
/// Validated [`Params`] already bound limit, burst (`<= 1e12`) and period (`<= 400 days`);
/// the windows and the log need nothing more. The bucket algorithms keep instants up to
/// `burst * period / limit` ahead of now, which must stay far enough below 2^53 µs: that refill
/// time must be at most [`MAX_REFILL_MICROS`]. Costs need no bound (anything above the
/// capacity is answered "cost exceeds capacity" even once rounded to a double).
pub fn fits_lua(params: &Params) -> Result<(), InexactInLua> {
    if !params.algorithm().uses_burst() {
        return Ok(());
    }
    let refill = u128::from(params.burst()) * u128::from(params.period_micros());
    if refill > u128::from(MAX_REFILL_MICROS) * u128::from(params.limit()) {
        return Err(InexactInLua(*params));
    }
    Ok(())
}

/// A limit the Redis scripts cannot decide exactly: its bucket takes longer than
/// [`MAX_REFILL_MICROS`] to refill.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "{} with burst {} and limit {} per {:?} takes longer than {} years to refill, \
     which the Redis store cannot represent exactly",
    .0.algorithm(),
    .0.burst(),
    .0.limit(),
    .0.period(),
    MAX_REFILL_MICROS / 31_557_600_000_000
)]
pub struct InexactInLua(pub Params);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A charge of a cost sends no "as the counter stands" flag, which only a check reads.
    #[test]
    fn only_a_check_is_flagged_as_answering_as_the_counter_stands() {
        use tollgate_core::{Algorithm, Params};
        let params = Params::new(Algorithm::FixedWindow, 10, Duration::from_secs(1), None).unwrap();
        let as_is = |cost| Charge {
            checks_as_is: true,
            ..Charge::new(b"k", &params, cost)
        };
        assert_eq!(decide_args(&as_is(1))[5], 1);
        assert_eq!(decide_args(&as_is(3))[5], 1);
        assert_eq!(decide_args(&as_is(0))[5], 9);
        assert_eq!(decide_args(&Charge::new(b"k", &params, 0))[5], 1);
    }

    #[test]
    fn scripts_end_with_their_driver() {
        assert!(DECIDE_SCRIPT.trim_end().ends_with("return out"));
        let batch = "return decide_batch(KEYS, ARGV)";
        assert!(DECIDE_BATCH_SCRIPT.trim_end().ends_with(batch));
        let library = decide_batch_library();
        let hash = library
            .function
            .trim_start_matches("tollgate_decide_batch_");
        assert_eq!(hash.len(), 40, "{}", library.function);
        assert!(
            library
                .code
                .starts_with(&format!("#!lua name=tollgate_{hash}\n"))
        );
        assert!(library.code.trim_end().ends_with("decide_batch)"));
        assert!(REFUND_SCRIPT.trim_end().ends_with("return refunded"));
    }

    #[test]
    fn a_batch_request_is_one_argument_of_words() {
        let mut buf = Vec::new();
        let charges = [
            [1, 1000, 1_000_000, 1000, 1, 1],
            [6, 7, 60_000_000, 0, 0, 9],
        ];
        batch_request_arg(&mut buf, true, charges.iter());
        assert_eq!(buf, b"1 2 1 1000 1000000 1000 1 1 6 7 60000000 0 0 9");
        buf.clear();
        batch_request_arg(&mut buf, false, [[u64::MAX, 0, 0, 0, 0, 0]].iter());
        assert_eq!(buf, b"0 1 18446744073709551615 0 0 0 0 0");
    }

    #[test]
    fn a_batch_reply_splits_by_request() {
        use redis::Value::{BulkString, Int, SimpleString};
        let ints = |v: &[i64]| v.iter().map(|&i| Int(i)).collect::<Vec<_>>();
        // The call's now, then: a full reply, an error, a request of two charges, a short form.
        let mut reply = ints(&[7, 5, 1, 0, 9, 100, -1, 0, 1]);
        reply.extend([Int(-1), BulkString(b"WRONGTYPE no".to_vec())]);
        reply.extend(ints(&[5, 0, 1, 0, 100, 100, 0, 0, 0, 0, 0, -1, 0, 0]));
        reply.extend(ints(&[-2, 41, 250, 3]));
        let split = split_batch_reply(&reply, [1, 3, 2, 1]).unwrap();
        assert_eq!(split[0], Ok(vec![5, 1, 0, 9, 100, -1, 0, 1]));
        assert_eq!(split[1], Err("WRONGTYPE no".to_owned()));
        assert_eq!(split[2].as_ref().map(Vec::len), Ok(14));
        assert_eq!(split[3], Ok(vec![7, 1, 0, 41, 250, -1, 0, 3]));
        // Too few, too many, or not integers where numbers belong: not a batch reply.
        assert!(split_batch_reply(&reply, [1, 3, 2]).is_none());
        assert!(split_batch_reply(&reply, [1, 3, 2, 1, 1]).is_none());
        assert!(split_batch_reply(&reply, [1, 3, 3, 1]).is_none());
        // A short form stands for one charge only, and holds three numbers.
        assert!(split_batch_reply(&ints(&[7, -2, 41, 250, 3]), [2]).is_none());
        assert!(split_batch_reply(&ints(&[7, -2, 41, 250]), [1]).is_none());
        // No now ahead of the requests: not a batch reply.
        assert!(split_batch_reply(&[], [0; 0]).is_none());
        let late = [Int(7), Int(-1), SimpleString("late".into())];
        assert_eq!(
            split_batch_reply(&late, [4]).unwrap(),
            vec![Err("late".into())]
        );
        assert!(split_batch_reply(&[Int(7), Int(5), SimpleString("x".into())], [0]).is_none());
    }

    #[test]
    fn refill_time_bounds_the_buckets_only() -> Result<(), Box<dyn std::error::Error>> {
        let year = Duration::from_secs(365 * 86_400);
        let params = |algorithm, limit, burst| {
            Params::new(algorithm, limit, year, burst).map_err(|e| e.to_string())
        };
        // 35 bursts of one per year fit; 36 do not.
        fits_lua(&params(Algorithm::Gcra, 1, Some(35))?)?;
        assert!(fits_lua(&params(Algorithm::TokenBucket, 1, Some(36))?).is_err());
        assert!(fits_lua(&params(Algorithm::LeakyBucket, 1, Some(1_000_000))?).is_err());
        fits_lua(&params(Algorithm::FixedWindow, 1, None)?)?;
        fits_lua(&params(
            Algorithm::SlidingWindowCounter,
            1_000_000_000_000,
            None,
        )?)?;
        Ok(())
    }
}
