//! A private PostgreSQL server for tests that stop and restart it under a running exchange.

use super::{path, scratch};
use crate::ScratchDir;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A private PostgreSQL cluster: `initdb` into a scratch directory, `pg_ctl start` on a free
/// port, stopped (`-m immediate`) and removed on drop. Its server can be restarted under a
/// running exchange, which a shared server cannot. Run as `postgres` when the tests run as root
/// (PostgreSQL refuses root).
pub struct PgCluster {
    /// Its data, socket and log.
    pub dir: ScratchDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PgCluster {
    /// `initdb` and `pg_ctl start` in a fresh `tag` folder; panics if PostgreSQL's binaries
    /// are missing.
    pub fn start(tag: &str) -> Self {
        let dir = scratch(tag);
        let port = crate::free_port().unwrap();
        let cluster = Self { dir, port };
        if cluster.as_root() {
            let chown = Command::new("chown")
                .args(["-R", "postgres:postgres", path(&cluster.dir.path)])
                .status()
                .unwrap();
            assert!(chown.success());
        }
        cluster.tool(
            "initdb",
            &[
                "-D",
                path(&cluster.data()),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        cluster.pg_ctl(&["start", "-w", "-t", "30"]);
        cluster
    }

    fn as_root(&self) -> bool {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
    }

    fn data(&self) -> PathBuf {
        self.dir.path.join("data")
    }

    fn tool(&self, program: &str, args: &[&str]) {
        let program = &pg_binary(program);
        let mut command = if self.as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", program]);
            c
        } else {
            Command::new(program)
        };
        let out = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{program} runs (PostgreSQL's binaries on PATH): {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl <args> -D <data>` with the cluster's port, its socket in its own directory.
    pub fn pg_ctl(&self, args: &[&str]) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            path(&self.dir.path)
        );
        let log = self.dir.path.join("postgres.log");
        let data = self.data();
        let mut all = vec!["-D", path(&data), "-o", &options, "-l", path(&log)];
        all.extend_from_slice(args);
        self.tool("pg_ctl", &all);
    }

    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}

/// PostgreSQL's `program`: on PATH, else in the newest Debian `/usr/lib/postgresql/<v>/bin`
/// (where `scripts/setup.sh`'s `postgresql` package puts it, off PATH).
fn pg_binary(program: &str) -> String {
    let on_path = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|out| out.status.success());
    if on_path {
        return program.to_owned();
    }
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    versions.last().map_or_else(
        || program.to_owned(),
        |v| format!("/usr/lib/postgresql/{v}/bin/{program}"),
    )
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data();
        let pg_ctl = pg_binary("pg_ctl");
        let mut command = if self.as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &pg_ctl]);
            c
        } else {
            Command::new(&pg_ctl)
        };
        let _ = command
            .args(["stop", "-m", "immediate", "-D", path(&data)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
