//! Health probes with axum: `/ready` answers 200 while the inbox can work (the database answers
//! with the current schema, the source is not failing) and 503 otherwise, with `Inbox::health`
//! as its JSON body; `/live` answers 200 while the process serves at all. The inbox runs beside
//! the server, on embedded SQLite and the in-memory broker.
//!
//! `cargo run --example health` serves on 127.0.0.1:8080 (set `PORT` to change it; `PORT=0`
//! picks a free one), asks itself once, prints the answer and stops; with `--serve` it keeps
//! serving until Ctrl-C.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use inbox::prelude::*;
use inbox::{Health, MemoryBroker};
use sqlx::Sqlite;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "order.paid")]
struct OrderPaid {
    event_id: u64,
    amount: i64,
}

#[inbox_handler(key = "event_id")]
async fn book(tx: &mut sqlx::SqliteConnection, msg: OrderPaid) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO payments (amount) VALUES ($1)")
        .bind(msg.amount)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// 200 with the health report when ready, 503 with it when not.
async fn ready(State(inbox): State<Inbox<Sqlite>>) -> (StatusCode, Json<Health>) {
    let health = inbox.health().await;
    let status = match health.ready {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, Json(health))
}

/// 200 while the process answers.
async fn live() -> StatusCode {
    StatusCode::OK
}

fn probes(inbox: Inbox<Sqlite>) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .route("/live", get(live))
        .with_state(inbox)
}

/// One plain HTTP/1.1 GET, as a probe sends it; the whole response.
async fn probe(address: std::net::SocketAddr, path: &str) -> Res<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

#[tokio::main]
async fn main() -> Res<()> {
    // One connection that lives as long as the pool: an in-memory database is per connection.
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect("sqlite::memory:")
        .await?;
    inbox::migrate(&pool).await?;
    sqlx::query("CREATE TABLE payments (amount INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let inbox = Inbox::builder(pool).handler(book).build().await?;
    let broker = MemoryBroker::new();
    broker.publish(Envelope::encode(
        "p-1",
        &OrderPaid {
            event_id: 1,
            amount: 30,
        },
    )?);
    let consuming = tokio::spawn({
        let inbox = inbox.clone();
        let source = broker.source();
        async move { inbox.run(source).await }
    });

    let port = std::env::var("PORT").unwrap_or_else(|_| "8080".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let address = listener.local_addr()?;
    let serving = tokio::spawn(async move { axum::serve(listener, probes(inbox)).await });
    println!("probes on http://{address}/ready and http://{address}/live");

    if std::env::args().any(|arg| arg == "--serve") {
        tokio::signal::ctrl_c().await?;
    } else {
        let answer = probe(address, "/ready").await?;
        println!("GET /ready ->\n{answer}");
        assert!(answer.starts_with("HTTP/1.1 200"), "not ready: {answer}");
        assert!(answer.contains(r#""ready":true"#), "{answer}");
    }
    broker.close();
    consuming.await??;
    serving.abort();
    Ok(())
}
