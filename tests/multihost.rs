//! One mesh over several hosts: `mpirun --host h1:2,h2:2 weft train ...`
//! gives bitwise the one-process metrics and checkpoint files (a pipeline
//! with one stage per host too), each
//! process names its host and local rank, a checkpoint saved across hosts
//! resumes on another host layout, a checkpoint directory that one host
//! does not share is a named error before the first step, and a host cut
//! off the network stops the processes on both sides within the collective
//! timeout, naming the other side, with the checkpoints committed before
//! the cut whole.
//!
//! The hosts are network and UTS namespaces of this machine
//! (`tests/hosts/netns.sh`): each has its own address on a bridge and its
//! own host name, Open MPI starts its daemons there through a launch agent
//! instead of ssh, and the processes of different hosts talk over TCP
//! (those of one host over shared memory), as on a cluster. Needs root,
//! `ip` (iproute2) and `unshare`, besides `mpirun` and `--features mpi`:
//! without them the tests fail under `CI=true` and print SKIPPED
//! elsewhere.

mod mpi_support;

use mpi_support::{mpirun, mpirun_or_skip, ok, read, root, skip, step_files, train, train_args as args, train_under};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Hosts `h1..hN` in namespaces, removed when dropped.
struct NetHosts {
    prefix: String,
    count: usize,
    subnet: String,
}

fn netns_script() -> PathBuf {
    root().join("tests/hosts/netns.sh")
}

impl NetHosts {
    /// `count` hosts; `tag` keeps the namespaces and subnets of tests that
    /// run at once apart.
    fn up_or_skip(test: &str, count: usize, tag: u32) -> Option<NetHosts> {
        mpirun_or_skip(test)?;
        let pid = std::process::id();
        let prefix = format!("w{}t{tag}", pid % 10_000);
        let octet = 1 + (pid % 60) * 4 + tag % 4;
        let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let tools = ["ip", "unshare"]
            .iter()
            .all(|t| Command::new(t).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok());
        let why = if !is_root {
            "network namespaces need root".to_string()
        } else if !tools {
            "needs `ip` (apt-get install iproute2) and `unshare` (util-linux)".to_string()
        } else {
            let o = Command::new(netns_script())
                .args(["up", &prefix, &count.to_string(), &octet.to_string()])
                .output()
                .expect("runs netns.sh");
            if o.status.success() {
                return Some(NetHosts { prefix, count, subnet: format!("10.213.{octet}.0/24") });
            }
            Command::new(netns_script()).args(["down", &prefix, &count.to_string()]).status().ok();
            format!("cannot make network namespaces: {}", String::from_utf8_lossy(&o.stderr).trim())
        };
        skip(test, &why);
        None
    }

    /// `mpirun` placing `n` processes on `hosts` (`"h1:2,h2:2"`; `by_node`:
    /// round robin over the hosts instead of filling each in turn),
    /// starting its daemons in the namespaces and keeping MPI's traffic on
    /// the bridge.
    fn mpirun(&self, n: usize, hosts: &str, by_node: bool) -> Command {
        let mut c = mpirun(n);
        c.args(["--host", hosts]);
        if by_node {
            c.args(["--map-by", "node"]);
        }
        let agent = format!("{} agent", netns_script().display());
        c.args(["--mca", "plm_rsh_agent", &agent]);
        c.args(["--mca", "oob_tcp_if_include", &self.subnet, "--mca", "btl_tcp_if_include", &self.subnet]);
        c.args(["--mca", "btl", "self,vader,tcp"]);
        // Open MPI's session directory is named by host name and user
        // (`/tmp/ompi.h1.0`), and the tests that run at once all have a
        // host `h1` sharing this machine's /tmp: each set of hosts gets a
        // directory of its own.
        let session = self.session_dir();
        std::fs::create_dir_all(&session).expect("a session directory");
        c.args(["--mca", "orte_tmpdir_base", session.to_str().expect("a UTF-8 path")]);
        c.env("WEFT_NETNS_PREFIX", &self.prefix);
        c
    }

    /// Where this set of hosts keeps Open MPI's session directories.
    fn session_dir(&self) -> PathBuf {
        std::env::temp_dir().join(format!("weft-ompi-{}", self.prefix))
    }
}

impl Drop for NetHosts {
    fn drop(&mut self) {
        Command::new(netns_script()).args(["down", &self.prefix, &self.count.to_string()]).status().ok();
        let _ = std::fs::remove_dir_all(self.session_dir());
    }
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The metrics file and checkpoint root in `dir`.
fn files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("metrics.jsonl"), dir.join("ckpt"))
}

#[test]
fn two_hosts_train_bitwise_like_one_process() {
    let Some(hosts) = NetHosts::up_or_skip("two_hosts_train_bitwise_like_one_process", 2, 0) else { return };
    let tmp = tempfile::tempdir().unwrap();
    for (config, strategy) in [("examples/configs/mlp.toml", "dp"), ("examples/configs/gpt.toml", "fsdp_tp")] {
        let name = config.replace('/', "_");
        let one = tmp.path().join(format!("{name}-one"));
        let (m1, k1) = files(&one);
        ok(&train(0, config, &args(strategy, "6", &m1, &k1), &[]), &format!("{config} {strategy} in one process"));
        // Two hosts of two processes each.
        let two = tmp.path().join(format!("{name}-hosts"));
        let (m2, k2) = files(&two);
        let o = train_under(Some(hosts.mpirun(4, "h1:2,h2:2", false)), config, &args(strategy, "6", &m2, &k2), &[]);
        ok(&o, &format!("{config} {strategy} on two hosts"));
        let out = stdout(&o);
        assert!(out.contains("hosts h1 (processes 0-1), h2 (processes 2-3)"), "{out}");
        assert!(out.contains("process 0 of 4 on host h1 (local rank 0 of 2; 2 hosts)"), "{out}");
        assert!(read(&m2) == read(&m1), "{config} {strategy}: metrics on two hosts differ from one process");
        for step in ["step_00000003", "step_00000006"] {
            assert!(step_files(&k2.join(step)) == step_files(&k1.join(step)), "{config} {strategy}: {step} differs");
        }
        if strategy == "fsdp_tp" {
            // The step-3 checkpoint saved across two hosts resumes on three
            // processes dealt round robin over them (h1: 0, 2; h2: 1).
            std::fs::remove_dir_all(k2.join("step_00000006")).unwrap();
            let resumed = tmp.path().join(format!("{name}-resumed.jsonl"));
            std::fs::copy(&m2, &resumed).unwrap();
            let mut a = args(strategy, "6", &resumed, &k2);
            a.push("--resume");
            let o = train_under(Some(hosts.mpirun(3, "h1:2,h2:1", true)), config, &a, &[]);
            ok(&o, "resume on three processes over two hosts");
            let out = stdout(&o);
            assert!(out.contains("hosts h1 (processes 0,2), h2 (process 1)"), "{out}");
            assert!(read(&resumed) == read(&m1), "the resumed run differs from the uninterrupted one");
            assert!(step_files(&k2.join("step_00000006")) == step_files(&k1.join("step_00000006")));
        }
    }
    // A pipeline with one stage per host (each stage tensor parallel over
    // its host's two devices): activations and cotangents cross over TCP.
    let config = "examples/configs/pipelined.toml";
    let pipe = |m: &Path, k: &Path| -> Vec<String> {
        let a = ["--mesh", "stage=2,model=2", "--strategy", "tp", "--steps", "6", "--checkpoint-every", "3"];
        let files = ["--metrics".into(), m.display().to_string(), "--checkpoint-dir".into(), k.display().to_string()];
        a.iter().map(|s| s.to_string()).chain(files).collect()
    };
    let one = tmp.path().join("pipelined-one");
    let (m1, k1) = files(&one);
    let a1 = pipe(&m1, &k1);
    let a1: Vec<&str> = a1.iter().map(String::as_str).collect();
    ok(&train(0, config, &a1, &[]), "the pipeline in one process");
    let two = tmp.path().join("pipelined-hosts");
    let (m2, k2) = files(&two);
    let a2 = pipe(&m2, &k2);
    let a2: Vec<&str> = a2.iter().map(String::as_str).collect();
    let o = train_under(Some(hosts.mpirun(2, "h1:1,h2:1", false)), config, &a2, &[]);
    ok(&o, "the pipeline over two hosts");
    let out = stdout(&o);
    assert!(out.contains("hosts h1 (process 0), h2 (process 1)"), "{out}");
    assert!(out.contains("stages on processes: process 0: stage 0; process 1: stage 1"), "{out}");
    assert!(read(&m2) == read(&m1), "pipeline: metrics on two hosts differ from one process");
    for step in ["step_00000003", "step_00000006"] {
        assert!(step_files(&k2.join(step)) == step_files(&k1.join(step)), "pipeline: {step} differs");
    }
}

#[test]
fn a_checkpoint_directory_one_host_does_not_share_is_a_named_error() {
    let test = "a_checkpoint_directory_one_host_does_not_share_is_a_named_error";
    let Some(hosts) = NetHosts::up_or_skip(test, 2, 1) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (m, k) = files(tmp.path());
    std::fs::create_dir_all(&k).unwrap();
    // Host h2 gets an empty file system of its own over the directory.
    let mut launcher = hosts.mpirun(4, "h1:2,h2:2", false);
    launcher.env("WEFT_NETNS_PRIVATE", format!("h2:{}", k.display()));
    let o = train_under(Some(launcher), "examples/configs/mlp.toml", &args("dp", "6", &m, &k), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "{} is not one directory shared by every process: process 0 (host h1) wrote a file there that \
             processes [2, 3] (host h2) do not see",
            k.display()
        )),
        "{err}"
    );
    // Before any step: nothing was saved, and the check's file is gone.
    let left: Vec<_> = std::fs::read_dir(&k).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
    // The same directory shared by both hosts trains.
    let o = train_under(
        Some(hosts.mpirun(4, "h1:2,h2:2", false)),
        "examples/configs/mlp.toml",
        &args("dp", "3", &m, &k),
        &[],
    );
    ok(&o, "the shared directory");
    assert!(k.join("step_00000003").is_dir());
}

/// The pids of the `weft` processes running on `host`.
fn weft_pids_on(hosts: &NetHosts, host: &str) -> Vec<u32> {
    let o = Command::new("ip").args(["netns", "pids", &format!("{}-{host}", hosts.prefix)]).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "weft"))
        .collect()
}

fn gone(pid: u32) -> bool {
    // Gone, or a zombie waiting for its parent (the daemon) to reap it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
}

#[test]
fn a_host_cut_off_the_network_stops_both_sides_within_the_timeout() {
    let test = "a_host_cut_off_the_network_stops_both_sides_within_the_timeout";
    let Some(hosts) = NetHosts::up_or_skip(test, 2, 2) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (m, k) = files(tmp.path());
    let mut launcher = hosts.mpirun(4, "h1:2,h2:2", false);
    launcher.args(["-x", "WEFT_COLLECTIVE_TIMEOUT"]).env("WEFT_COLLECTIVE_TIMEOUT", "5");
    launcher.arg(mpi_support::WEFT).arg("train").arg(root().join("examples/configs/mlp.toml"));
    launcher.args(args("dp", "1000000", &m, &k)).arg("-q");
    let mut child = launcher.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Training on both hosts, a checkpoint committed.
    let t = Instant::now();
    let (mut h1, mut h2) = (Vec::new(), Vec::new());
    while t.elapsed() < Duration::from_secs(60) && (h1.len() < 2 || h2.len() < 2 || !k.join("step_00000003").exists()) {
        std::thread::sleep(Duration::from_millis(100));
        (h1, h2) = (weft_pids_on(&hosts, "h1"), weft_pids_on(&hosts, "h2"));
        assert!(child.try_wait().unwrap().is_none(), "the job ended before the cut");
    }
    assert!(h1.len() == 2 && h2.len() == 2, "two weft processes on each host: {h1:?} {h2:?}");
    // Host h2 drops off the network.
    let cut = Instant::now();
    let down = Command::new("ip").args(["link", "set", &format!("{}-v2", hosts.prefix), "down"]).status().unwrap();
    assert!(down.success());
    // Each side waits at most the collective timeout (5 s) in a collective,
    // names the other side and stops; none is left running.
    let limit = Duration::from_secs(5 + 25);
    while cut.elapsed() < limit && !h1.iter().chain(&h2).all(|&p| gone(p)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped_in = cut.elapsed();
    let left: Vec<u32> = h1.iter().chain(&h2).copied().filter(|&p| !gone(p)).collect();
    // mpirun itself waits for the lost host's daemon (Open MPI's, not
    // weft's: a scheduler's step timeout ends it); stop it, and what runs
    // in the namespaces (its daemons hold mpirun's output open), and read
    // what host h1's processes said.
    child.kill().ok();
    for host in ["h1", "h2"] {
        Command::new("sh")
            .arg("-c")
            .arg(format!("ip netns pids {}-{host} | xargs -r kill -9", hosts.prefix))
            .status()
            .ok();
    }
    let out = child.wait_with_output().unwrap();
    assert!(left.is_empty(), "weft processes {left:?} still run {stopped_in:?} after the cut");
    // h1's processes waited the timeout in whatever the cut met (a step's
    // collective, a checkpoint's exchange), and each that spoke named a
    // process of h2 among those that never sent. The first to stop aborts
    // the job (MPI_Abort), which may kill its peer on h1 before that one
    // writes its line; at least one of them speaks.
    let err = String::from_utf8_lossy(&out.stderr);
    let mut spoke = 0;
    for rank in [0, 1] {
        let Some(line) = err.lines().find(|l| l.starts_with(&format!("error: process {rank} of 4: "))) else {
            continue;
        };
        spoke += 1;
        assert!(line.contains(&format!("process {rank} waited 5s in ")), "{line}");
        let named = line.split("for process(es) [").nth(1).and_then(|r| r.split(']').next()).unwrap_or("");
        let named: Vec<usize> = named.split(", ").filter_map(|q| q.parse().ok()).collect();
        assert!(named.iter().any(|q| [2, 3].contains(q)), "process {rank} names no process of h2: {line}");
    }
    assert!(spoke >= 1, "no process of h1 named the cut: {err}");
    // The newest checkpoint committed before the cut validates and resumes.
    let newest = std::fs::read_dir(&k)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_prefix("step_")?.parse::<u64>().ok())
        .max()
        .expect("a committed checkpoint");
    let steps = newest.to_string();
    let o = train(0, "examples/configs/mlp.toml", &[&args("dp", &steps, &m, &k)[..], &["--resume"]].concat(), &[]);
    ok(&o, "resuming the newest checkpoint committed before the cut");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("skipping the checkpoint"), "a committed checkpoint was corrupt: {stderr}");
}

/// `weft launch` over two hosts, one of which drops off the network for
/// good: the job fails within the collective timeout, the launcher that
/// waits for the lost host's daemon is stopped after the exit grace, the
/// probes find h1 alone, and the job restarts there on two processes
/// (`--min-processes 2`), resumes its newest checkpoint and finishes with
/// the metrics of an uninterrupted run.
#[test]
fn a_launch_that_loses_a_host_restarts_on_the_other_and_finishes() {
    let test = "a_launch_that_loses_a_host_restarts_on_the_other_and_finishes";
    let Some(hosts) = NetHosts::up_or_skip(test, 2, 3) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (m, k) = files(tmp.path());
    let agent = format!("{} agent", netns_script().display());
    let mut c = Command::new(mpi_support::WEFT);
    c.args(["launch", "--hosts", "h1:2,h2:2", "--min-processes", "2", "--max-restarts", "2"]);
    c.args(["--restart-delay", "0.5", "--exit-grace", "5", "--probe-timeout", "10"]);
    for a in ["--allow-run-as-root", "--oversubscribe", "-x", "WEFT_COLLECTIVE_TIMEOUT", "--mca", "plm_rsh_agent"] {
        c.arg(format!("--mpi-arg={a}"));
    }
    c.arg(format!("--mpi-arg={agent}"));
    for (key, value) in
        [("oob_tcp_if_include", &hosts.subnet[..]), ("btl_tcp_if_include", &hosts.subnet), ("btl", "self,vader,tcp")]
    {
        c.args(["--mpi-arg=--mca", &format!("--mpi-arg={key}"), &format!("--mpi-arg={value}")]);
    }
    c.env("WEFT_NETNS_PREFIX", &hosts.prefix).env("WEFT_COLLECTIVE_TIMEOUT", "5");
    c.arg("--").arg("train").arg(root().join("examples/configs/mlp.toml"));
    // Steps of about 7 ms: the job is still early when h2 is cut off.
    c.args(args("dp", "600", &m, &k)).arg("-q");
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Training on both hosts, a checkpoint committed; then h2 is cut off.
    let t = Instant::now();
    let (mut h1, mut h2) = (Vec::new(), Vec::new());
    while t.elapsed() < Duration::from_secs(60) && (h1.len() < 2 || h2.len() < 2 || !k.join("step_00000003").exists()) {
        std::thread::sleep(Duration::from_millis(10));
        (h1, h2) = (weft_pids_on(&hosts, "h1"), weft_pids_on(&hosts, "h2"));
        if child.try_wait().unwrap().is_some() {
            let o = child.wait_with_output().unwrap();
            panic!("the job ended before the cut: {}", String::from_utf8_lossy(&o.stderr));
        }
    }
    assert!(h1.len() == 2 && h2.len() == 2, "two weft processes on each host: {h1:?} {h2:?}");
    let down = Command::new("ip").args(["link", "set", &format!("{}-v2", hosts.prefix), "down"]).status().unwrap();
    assert!(down.success());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(240) && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(200));
    }
    if child.try_wait().unwrap().is_none() {
        child.kill().ok();
    }
    // Open MPI's daemon on the lost host never learns that its job is
    // gone, and holds the output open: as a lost machine would, it goes
    // with the host (here, with what runs in the namespaces).
    for host in ["h1", "h2"] {
        let ns = format!("ip netns pids {}-{host} | xargs -r kill -9", hosts.prefix);
        Command::new("sh").arg("-c").arg(ns).status().ok();
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("weft launch: lost host h2"), "{err}");
    assert!(err.contains("weft launch: restart 1 of 2 in 0.5 s on 2 processes"), "{err}");
    let log = std::fs::read_to_string(k.join("launch.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let actions: Vec<&str> = records.iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["restart", "finished"], "{log}");
    assert_eq!((records[1]["processes"].as_u64(), records[1]["hosts"].as_str()), (Some(2), Some("h1:2")), "{log}");
    // Bitwise an uninterrupted run.
    let one = tmp.path().join("one");
    let (m1, k1) = files(&one);
    ok(&train(0, "examples/configs/mlp.toml", &args("dp", "600", &m1, &k1), &[]), "uninterrupted");
    assert!(read(&m) == read(&m1), "the restarted job's metrics differ from the uninterrupted run");
}
