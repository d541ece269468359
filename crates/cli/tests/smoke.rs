mod common;
use common::Daemon;

#[test]
fn create_exec_destroy_leaves_nothing() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let (code, out, _) = d.sh(&id, "echo hi; hostname");
    assert_eq!(code, 0);
    assert_eq!(out, format!("hi\n{id}\n"));
    let pid = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    d.ok(&["destroy", &id]);
    assert_eq!(d.leftovers(&id, pid), Vec::<String>::new());
}

#[test]
fn the_demo_runs_every_step() {
    common::require_root();
    common::become_subreaper();
    let out = common::output_within(
        std::process::Command::new(common::CAIRN).arg("demo").env_remove("CAIRN_URL").env_remove("CAIRN_TOKEN").stdin(std::process::Stdio::null()),
        std::time::Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cairn demo failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.lines().last().is_some_and(|l| l.starts_with("all steps passed")), "{text}");
    for step in ["over plain HTTP", "raw bytes", "Prometheus metrics", "through the SDK (import cairn)", "an MCP client", "an agent written for E2B", "the sandbox's own inotify", "a new sandbox from it reads", "roll back", "fork", "approval", "the approver is told: task.waiting", "and the hook posts task.woken", "the web console", "backup of the node while it runs", "webhook", "proxy", "the agent sees only its placeholder", "cp out refuses", "verify the record", "nothing of the completed task is left"] {
        assert!(text.contains(step), "the demo shows {step:?}: {text}");
    }
}

#[test]
fn completing_a_running_task_leaves_nothing() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let (code, _, _) = d.sh(&id, "echo work > /workspace/w");
    assert_eq!(code, 0);
    let pid = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    assert!(pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists(), "the sandbox runs before");
    d.ok(&["task", "complete", &id]);
    assert_eq!(d.state(&id), "completed");
    assert_eq!(d.leftovers(&id, pid), Vec::<String>::new());
    let err = d.fails(&["exec", &id, "--", "true"]);
    assert!(err.contains("completed"), "{err}");
}
