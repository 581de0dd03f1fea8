//! TLS to the database (feature `rustls`): a PostgreSQL URL with `sslmode=require` connects
//! encrypted, and the inbox works over it. The test server's certificate is self-signed, which
//! `require` accepts (it encrypts without verifying, as libpq does); `verify-full` with
//! `sslrootcert=...` is how a managed database's certificate is checked.

mod common;

use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.ping")]
struct Ping {
    id: u64,
}

#[inbox_handler(key = "id")]
async fn ping(_msg: Ping) -> Result<(), HandlerError> {
    Ok(())
}

#[tokio::test]
async fn a_postgres_url_with_sslmode_require_connects_encrypted() {
    let Some(url) = common::postgres_url("tls").await else {
        return;
    };
    let pool = sqlx::PgPool::connect(&format!("{url}&sslmode=require"))
        .await
        .expect("connect with sslmode=require");

    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    inbox::migrate(&pool).await.unwrap();
    let outcome = Process::<sqlx::Postgres>::process(&ping, &pool, Ping { id: 1 }).await;

    assert!(encrypted, "the connection is not encrypted");
    assert_eq!(outcome.unwrap(), Outcome::Processed);
}
