//! A harness for crash tests: run a child process that checkpoints, kill it
//! with SIGKILL at random moments, and check what it left after each kill.
//!
//! "Never loses work, never loads wrong data" is only believable if it
//! survives real crashes at arbitrary points, including in the middle of
//! writing a file or renaming a directory. In-process tests cannot do that,
//! so the harness kills a separate process. Integration tests usually make
//! the child by re-running their own binary on one test
//! ([`reinvoke_test`]) that does the checkpointing when an environment
//! variable is set. The harness is generic so that the training runner's
//! "resumed run equals uninterrupted run" test can reuse it.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kills a child process `kills` times, each after a random delay.
#[derive(Clone, Debug)]
pub struct CrashHarness {
    /// How many children to start and kill.
    pub kills: usize,
    /// The shortest time a child runs before it is killed.
    pub min_delay: Duration,
    /// The longest time a child runs before it is killed.
    pub max_delay: Duration,
    /// Seed of the delays (the same seed gives the same delays).
    pub seed: u64,
}

/// One kill: which round and how long the child had run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The round, from 0.
    pub round: usize,
    /// How long the child ran before it was killed.
    pub after: Duration,
}

impl CrashHarness {
    /// For each round: starts `spawn(round)`, kills it (SIGKILL on Unix)
    /// after a random delay, waits for it, then calls `check`. Fails if a
    /// child cannot start, exits by itself before the kill (its stderr is
    /// in the message), or `check` fails. Returns every kill.
    pub fn run(
        &self,
        mut spawn: impl FnMut(usize) -> Command,
        mut check: impl FnMut(&Kill) -> Result<(), String>,
    ) -> Result<Vec<Kill>, String> {
        let mut rng = self.seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut kills = Vec::with_capacity(self.kills);
        for round in 0..self.kills {
            let span = self.max_delay.saturating_sub(self.min_delay);
            let frac = (splitmix64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
            let delay = self.min_delay + span.mul_f64(frac);
            let mut cmd = spawn(round);
            cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
            let mut child = cmd.spawn().map_err(|e| format!("round {round}: cannot start the child: {e}"))?;
            let start = Instant::now();
            while start.elapsed() < delay {
                if let Some(status) = child.try_wait().map_err(|e| format!("round {round}: {e}"))? {
                    let mut err = String::new();
                    if let Some(mut s) = child.stderr.take() {
                        let _ = s.read_to_string(&mut err);
                    }
                    return Err(format!(
                        "round {round}: the child exited by itself ({status}) before the kill:\n{err}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(1).min(delay.saturating_sub(start.elapsed())));
            }
            child.kill().map_err(|e| format!("round {round}: cannot kill the child: {e}"))?;
            let after = start.elapsed();
            child.wait().map_err(|e| format!("round {round}: {e}"))?;
            let kill = Kill { round, after };
            check(&kill).map_err(|e| format!("round {round} (killed after {after:?}): {e}"))?;
            kills.push(kill);
        }
        Ok(kills)
    }
}

/// A command that runs the current executable's test `test` alone (exact
/// name, ignored tests included) with the environment variable `key` set to
/// `value`: the child process of an integration-test crash test.
pub fn reinvoke_test(test: &str, key: &str, value: &str) -> std::io::Result<Command> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([test, "--exact", "--include-ignored", "--test-threads=1", "--nocapture"]).env(key, value);
    Ok(cmd)
}

/// The SplitMix64 generator (Steele et al. 2014): a tiny, good-enough
/// source of kill delays without a dependency.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
