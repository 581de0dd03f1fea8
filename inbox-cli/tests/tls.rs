//! The `inbox` command over TLS (feature `rustls`, on by default): a PostgreSQL URL with
//! `sslmode=require`, as managed databases ask for, connects encrypted.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

#[tokio::test]
async fn migrate_and_status_work_over_a_url_with_sslmode_require() {
    let Some(url) = common::postgres_url("cli_tls").await else {
        return;
    };
    let url = format!("{url}&sslmode=require");

    let migrate = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["migrate", "--database-url", &url])
        .output()
        .unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["status", "--json", "--database-url", &url])
        .output()
        .unwrap();

    let stderr =
        |output: &std::process::Output| String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(migrate.status.success(), "{}", stderr(&migrate));
    assert!(status.status.success(), "{}", stderr(&status));
}
