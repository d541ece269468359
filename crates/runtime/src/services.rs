//! A task's declared services: long-running commands (a database, a dev
//! server) started in order whenever a sandbox starts for the task: on
//! create, after a rollback, in a fork. Each runs detached in its own session
//! with its output appended to `/var/log/cairn/service-<n>.log` inside.

use std::os::fd::AsRawFd;

use cairn_core::{EventKind, NewEvent, Task};
use cairn_sandbox::proto::{self, ExecRequest, Reply};
use serde_json::json;

use crate::runtime::Runtime;
use crate::Error;

/// Starts `$1` detached (its own session, so it outlives the request that
/// started it), appending its output to `$2`.
const LAUNCH: &str = "mkdir -p /var/log/cairn && setsid -f sh -c \"$1\" >>\"$2\" 2>&1 </dev/null";

impl Runtime {
    /// Starts the task's services in order; each start is in the log.
    pub(crate) async fn start_services(&self, task: &Task, actor: &str) -> Result<(), Error> {
        for (n, cmd) in task.config.services.iter().enumerate() {
            let log = format!("/var/log/cairn/service-{n}.log");
            let env = crate::exec::environment(&task.config, &[], task.id.as_str(), false, None)?;
            let req = ExecRequest {
                argv: vec!["sh".into(), "-c".into(), LAUNCH.into(), "cairn-service".into(), cmd.clone(), log.clone()],
                env,
                cwd: task.config.workdir.clone(),
                tty: None,
                // The launcher writes the log under /var/log: as root, as
                // the daemon's own work (the service itself too, for now).
                user: None,
            };
            let tid = task.id.to_string();
            let code = self.driver.run(move |driver| -> Result<i32, Error> {
                let null = std::fs::File::open("/dev/null").map_err(|e| Error::internal_from(e).context("/dev/null"))?;
                let fd = null.as_raw_fd();
                match driver.exec(&tid, &req, &[fd, fd, fd])? {
                    Ok(running) => match proto::recv::<Reply>(&running.conn)? {
                        Some((Reply::Exited { code, signal }, _)) => Ok(code.unwrap_or(128 + signal.unwrap_or(0))),
                        other => Err(Error::internal(format!("unexpected answer from the sandbox: {other:?}"))),
                    },
                    Err(message) => Err(Error::internal(message)),
                }
            })
            .await??;
            let ev = NewEvent {
                task: task.id.clone(),
                kind: EventKind::ServiceStart,
                actor: actor.to_owned(),
                args: json!({ "service": n, "command": cmd, "log": log }),
                exit_code: Some(code),
                duration_ms: None,
            };
            self.store.append_event(&ev).await?;
            if code != 0 {
                return Err(Error::internal(format!("service {n} ({cmd}) did not start: exit {code}")));
            }
        }
        Ok(())
    }
}
