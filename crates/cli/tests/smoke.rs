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
