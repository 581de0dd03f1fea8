//! The database failing under a running inbox, one message per transaction and batched: its
//! connections killed (a failover, a restarted proxy, an operator's `pg_terminate_backend`), on
//! PostgreSQL and MySQL (SQLite has no connections to kill), and a PostgreSQL server of the
//! test's own crashed and recovered. Nothing is lost, nothing applied twice, each aggregate's
//! events apply in order, and a lost connection counts no attempt against the handler.

mod common;

use common::ledger::Credited;

/// A broker holding `per_account` events of each of `accounts` accounts, each delivered twice,
/// the accounts' events interleaved and each account's in sequence order.
fn ledger_stream(accounts: i64, per_account: i64) -> inbox::MemoryBroker {
    let broker = inbox::MemoryBroker::new();
    for sequence in 1..=per_account {
        for account in 0..accounts {
            let id = format!("{account}-{sequence}");
            let event = Credited::new(format!("e-{id}"), format!("acct-{account}"), sequence, 1);
            let envelope = inbox::Envelope::encode(format!("d-{id}"), &event).expect("encode");
            broker.publish(envelope.clone());
            broker.publish(envelope);
        }
    }
    broker
}

/// `$whoami`: the statement that answers a connection's server-side id; `$kill`: the statement
/// that ends the connection with that id.
macro_rules! killed_connections_suite {
    ($db:ty, $conn:ty, $connect:path, $batch:expr, $whoami:expr, $kill:expr) => {
        use std::sync::{Arc, Mutex};
        use std::time::Duration;

        use inbox::prelude::*;
        use sqlx::Connection;

        use crate::common::ledger::Credited;

        $crate::common::ledger::ledger_handlers!($db, $conn);
        $crate::common::queries::ledger_queries!($db, $connect);

        /// A pool on the same database that notes the server-side id of every connection it opens.
        async fn noted_pool(pool: &Pool, ids: Arc<Mutex<Vec<i64>>>) -> Pool {
            let options = (*pool.connect_options()).clone();
            let noting = sqlx::pool::PoolOptions::<$db>::new()
                .max_connections(8)
                .after_connect(move |conn, _| {
                    let ids = Arc::clone(&ids);
                    Box::pin(async move {
                        let id: i64 = sqlx::query_scalar($whoami).fetch_one(&mut *conn).await?;
                        ids.lock().expect("ids").push(id);
                        Ok(())
                    })
                });
            noting.connect_with(options).await.expect("a second pool")
        }

        /// Ends every connection `ids` holds, from a connection of its own, every 300 ms for
        /// `rounds` rounds (connections opened meanwhile too); returns how many it ended.
        async fn kill_connections(pool: &Pool, ids: Arc<Mutex<Vec<i64>>>, rounds: usize) -> usize {
            let mut killer = pool
                .acquire()
                .await
                .expect("the killer's connection")
                .detach();
            let mut killed = 0;
            for _ in 0..rounds {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let doomed: Vec<i64> = std::mem::take(&mut *ids.lock().expect("ids"));
                for id in doomed {
                    // A connection that ended on its own is no longer there to kill.
                    let kill = sqlx::query(sqlx::AssertSqlSafe($kill(id))).execute(&mut killer);
                    killed += usize::from(kill.await.is_ok());
                }
            }
            killer.close().await.expect("close the killer's connection");
            killed
        }

        /// Runs the handler `with` registers over two deliveries of each account's events while
        /// the connections are killed: every event applies once, in order, none is skipped as
        /// stale (an event handed back must not let its successor overtake it), and no attempt
        /// is counted against the handler.
        async fn connections_killed_mid_run(
            test: &str,
            with: impl FnOnce(inbox::InboxBuilder<$db>) -> inbox::InboxBuilder<$db>,
        ) {
            let Some(pool) = ledger(test).await else {
                return;
            };
            let ids = Arc::new(Mutex::new(Vec::new()));
            let noted = noted_pool(&pool, Arc::clone(&ids)).await;
            let inbox = with($crate::common::builder(&noted, $batch))
                .workers(4)
                .build()
                .await
                .unwrap();
            let (accounts, per_account) = (12, 40);
            let broker = crate::ledger_stream(accounts, per_account);
            let killer = tokio::spawn({
                let (pool, ids) = (pool.clone(), Arc::clone(&ids));
                async move { kill_connections(&pool, ids, 8).await }
            });

            let report =
                run_until_applied(&inbox, &pool, broker.source(), accounts * per_account).await;
            let killed = killer.await.unwrap();

            assert!(
                killed > 0,
                "connections were killed under the run: {report:?}"
            );
            let failed_attempts = "SELECT COUNT(*) FROM inbox_messages WHERE attempt_count > 0";
            let counted: i64 = sqlx::query_scalar(failed_attempts)
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(
                counted, 0,
                "a lost connection is not the handler's failure: no attempt counted"
            );
            let stale = "SELECT COUNT(*) FROM inbox_messages WHERE status = 'stale'";
            let stale: i64 = sqlx::query_scalar(stale).fetch_one(&pool).await.unwrap();
            assert_eq!(stale, 0, "none overtaken by a later event: {report:?}");
            assert_eq!(
                count(&pool, "applied").await,
                accounts * per_account,
                "{report:?}"
            );
            for account in 0..accounts {
                let account = format!("acct-{account}");
                let sequences: Vec<i64> = applied(&pool, &account)
                    .await
                    .into_iter()
                    .map(|(sequence, _)| sequence)
                    .collect();
                assert_eq!(
                    sequences,
                    (1..=per_account).collect::<Vec<_>>(),
                    "each once, in order: {account}"
                );
                assert_eq!(balance(&pool, &account).await, per_account);
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn connections_killed_mid_run_lose_nothing_and_apply_nothing_twice() {
            let test = "killed_connections";
            connections_killed_mid_run(test, |inbox| inbox.handler(credit_strict)).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn connections_killed_mid_run_let_no_event_overtake_another() {
            let test = "killed_connections_monotonic";
            connections_killed_mid_run(test, |inbox| inbox.handler(credit)).await;
        }
    };
}

mod postgres {
    killed_connections_suite!(
        sqlx::Postgres,
        sqlx::PgConnection,
        crate::common::postgres,
        None,
        "SELECT pg_backend_pid()::int8",
        |id: i64| format!("SELECT pg_terminate_backend({id})")
    );
}

mod postgres_batched {
    killed_connections_suite!(
        sqlx::Postgres,
        sqlx::PgConnection,
        crate::common::postgres,
        Some(inbox::Batch::new(16)),
        "SELECT pg_backend_pid()::int8",
        |id: i64| format!("SELECT pg_terminate_backend({id})")
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    killed_connections_suite!(
        sqlx::MySql,
        sqlx::MySqlConnection,
        crate::common::mysql,
        None,
        "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        |id: i64| format!("KILL {id}")
    );
}

#[cfg(feature = "mysql")]
mod mysql_batched {
    killed_connections_suite!(
        sqlx::MySql,
        sqlx::MySqlConnection,
        crate::common::mysql,
        Some(inbox::Batch::new(16)),
        "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        |id: i64| format!("KILL {id}")
    );
}

/// A PostgreSQL server of the test's own (initialized in a directory of its own, on a free port
/// below 32768), crashed with `pg_ctl stop -m immediate` (as a power cut or `kill -9` of the
/// postmaster would: recovery replays the write-ahead log) and started again.
mod postgres_crash {
    use std::path::PathBuf;
    use std::process::Command;
    use std::time::Duration;

    use inbox::prelude::*;
    use sqlx::PgPool;

    use crate::common::ledger::{Credited, LEDGER_TABLES};

    crate::common::ledger::ledger_handlers!(sqlx::Postgres, sqlx::PgConnection);

    struct OwnServer {
        bin: PathBuf,
        dir: PathBuf,
        port: u16,
    }

    impl OwnServer {
        /// Initializes and starts a server, or `None` (with a line saying so) when PostgreSQL is
        /// not configured for the tests or its programs are not installed, unless under `CI=true`.
        async fn start(test: &str) -> Option<Self> {
            crate::common::postgres_url(test).await?;
            let Some(bin) = installed_bin() else {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "CI must run the database crash test, but PostgreSQL's `initdb` is not installed"
                );
                crate::common::skip::skip(
                    test,
                    "the crash test needs PostgreSQL's `initdb` and `pg_ctl`",
                );
                return None;
            };
            let port = crate::common::free_port();
            let dir = std::env::temp_dir().join(format!("inbox_pg_{port}_{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a data directory");
            run("chown", &["postgres", &dir.display().to_string()]);
            let server = OwnServer { bin, dir, port };
            server.pg(
                "initdb",
                &[
                    "-D",
                    &server.data(),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                ],
            );
            let settings = format!(
                "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n",
                server.dir.display()
            );
            let config = server.dir.join("data/postgresql.conf");
            let mut conf = std::fs::read_to_string(&config).expect("read postgresql.conf");
            conf.push_str(&settings);
            std::fs::write(&config, conf).expect("write postgresql.conf");
            server.pg_ctl("start");
            Some(server)
        }

        fn data(&self) -> String {
            self.dir.join("data").display().to_string()
        }

        fn url(&self) -> String {
            format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
        }

        /// Runs one of PostgreSQL's programs as the `postgres` user.
        fn pg(&self, program: &str, args: &[&str]) {
            let program = self.bin.join(program).display().to_string();
            let mut command = vec!["-u", "postgres", "--", &program];
            command.extend(args);
            run("runuser", &command);
        }

        /// `pg_ctl start` or `stop -m immediate`, waiting until it is done.
        fn pg_ctl(&self, action: &str) {
            let log = self.dir.join("log").display().to_string();
            let data = self.data();
            let mut args = vec!["-D", &data, "-l", &log, "-w", action];
            if action == "stop" {
                args.extend(["-m", "immediate"]);
            }
            self.pg("pg_ctl", &args);
        }

        /// Crashes the server, and starts it again on its data.
        fn crash_and_restart(&self) {
            self.pg_ctl("stop");
            self.pg_ctl("start");
        }
    }

    impl Drop for OwnServer {
        fn drop(&mut self) {
            let (data, program) = (self.data(), self.bin.join("pg_ctl").display().to_string());
            let stop = [
                "-u",
                "postgres",
                "--",
                &program,
                "-D",
                &data,
                "-m",
                "immediate",
                "stop",
            ];
            let _ = Command::new("runuser").args(stop).output();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// The directory of PostgreSQL's server programs (Debian keeps them per major version).
    fn installed_bin() -> Option<PathBuf> {
        let versions = std::fs::read_dir("/usr/lib/postgresql").ok()?;
        let bins = versions.filter_map(|version| Some(version.ok()?.path().join("bin")));
        bins.filter(|bin| bin.join("initdb").exists()).max()
    }

    fn run(program: &str, args: &[&str]) {
        let output = Command::new(program).args(args).output().expect(program);
        assert!(
            output.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The events applied so far, or `None` while the server does not answer.
    async fn applied_count(pool: &PgPool) -> Option<i64> {
        sqlx::query_scalar("SELECT COUNT(*) FROM applied")
            .fetch_one(pool)
            .await
            .ok()
    }

    /// Crashes the server under a run of the handler `with` registers, and checks that every
    /// event applied once, in order.
    async fn database_crash_mid_run(
        test: &str,
        batch: Option<inbox::Batch>,
        with: impl FnOnce(inbox::InboxBuilder<sqlx::Postgres>) -> inbox::InboxBuilder<sqlx::Postgres>,
    ) {
        let Some(server) = OwnServer::start(test).await else {
            return;
        };
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&server.url())
            .await
            .expect("connect");
        inbox::migrate(&pool).await.expect("migrate");
        for ddl in LEDGER_TABLES {
            sqlx::query(ddl)
                .execute(&pool)
                .await
                .expect("create ledger table");
        }
        let (accounts, per_account) = (12, 40);
        let broker = crate::ledger_stream(accounts, per_account);
        let inbox = with(crate::common::builder(&pool, batch))
            .workers(4)
            .build()
            .await
            .unwrap();
        let total = accounts * per_account;
        let watched = pool.clone();
        let all_applied = async move {
            for _ in 0..1_200 {
                if applied_count(&watched)
                    .await
                    .is_some_and(|applied| applied >= total)
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let run = tokio::spawn(async move { inbox.run_until(broker.source(), all_applied).await });
        crate::common::eventually_async("some messages applied", || async {
            applied_count(&pool)
                .await
                .is_some_and(|applied| applied >= 40)
        })
        .await;

        server.crash_and_restart();
        let report = run.await.unwrap().expect("the run survives the crash");

        let log = std::fs::read_to_string(server.dir.join("log")).expect("the server's log");
        assert!(
            log.contains("automatic recovery in progress"),
            "the server recovered from a crash: {log}"
        );
        assert_eq!(applied_count(&pool).await, Some(total), "{report:?}");
        for account in 0..accounts {
            let order = "SELECT sequence FROM applied WHERE account = $1 ORDER BY position";
            let account = format!("acct-{account}");
            let sequences: Vec<i64> = sqlx::query_scalar(order)
                .bind(&account)
                .fetch_all(&pool)
                .await
                .unwrap();
            assert_eq!(
                sequences,
                (1..=per_account).collect::<Vec<_>>(),
                "each once, in order: {account}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_crash_mid_run_loses_nothing_and_applies_nothing_twice() {
        let strict = |inbox: inbox::InboxBuilder<_>| inbox.handler(credit_strict);
        database_crash_mid_run("database_crash", None, strict).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_crash_mid_batch_loses_nothing_and_applies_nothing_twice() {
        let strict = |inbox: inbox::InboxBuilder<_>| inbox.handler(credit_strict);
        let batch = Some(inbox::Batch::new(16));
        database_crash_mid_run("database_crash_batched", batch, strict).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_crash_lets_no_event_overtake_another() {
        let monotonic = |inbox: inbox::InboxBuilder<_>| inbox.handler(credit);
        database_crash_mid_run("database_crash_monotonic", None, monotonic).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_crash_mid_batch_lets_no_event_overtake_another() {
        let monotonic = |inbox: inbox::InboxBuilder<_>| inbox.handler(credit);
        let batch = Some(inbox::Batch::new(16));
        database_crash_mid_run("database_crash_monotonic_batched", batch, monotonic).await;
    }
}

/// A run that ends while a message's transaction fails with nothing recorded (its connection
/// lost): that message goes back to the broker, and so do the later messages of its aggregate
/// that the run had pulled, unrun. Had they run, the message would come back after them, stale.
mod postgres_shutdown {
    use std::time::Duration;

    use inbox::prelude::*;

    use crate::common::ledger::Credited;

    crate::common::ledger::ledger_handlers!(sqlx::Postgres, sqlx::PgConnection);
    crate::common::queries::ledger_queries!(sqlx::Postgres, crate::common::postgres);

    /// Told by the handler when the run is to stop.
    static STOP: tokio::sync::Notify = tokio::sync::Notify::const_new();

    /// Credits; at an account's first event, asks the run to stop, waits until it stopped
    /// pulling, then loses its connection (ends it itself).
    #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "account")]
    async fn credit_then_lose_the_connection(
        tx: &mut sqlx::PgConnection,
        msg: Credited,
    ) -> Result<(), HandlerError> {
        if msg.sequence == 1 {
            STOP.notify_one();
            tokio::time::sleep(Duration::from_millis(500)).await;
            let end = "SELECT pg_terminate_backend(pg_backend_pid())";
            sqlx::query(end).execute(&mut *tx).await?;
        }
        apply_credit(tx, &msg).await
    }

    #[tokio::test]
    async fn a_message_handed_back_at_shutdown_is_not_overtaken_by_its_successor() {
        let Some(pool) = ledger("shutdown_hand_back").await else {
            return;
        };
        let broker = inbox::MemoryBroker::new();
        for sequence in 1..=2 {
            let event = Credited::new(format!("e-{sequence}"), "acct-1", sequence, 1);
            broker.publish(Envelope::encode(format!("d-{sequence}"), &event).unwrap());
        }
        // One connection, taken from the pool for each message: the lost one is not reused.
        let options = (*pool.connect_options()).clone();
        let one = sqlx::postgres::PgPoolOptions::new().max_connections(1);
        let one = one.connect_with(options).await.unwrap();
        let stopping = Inbox::builder(one)
            .handler(credit_then_lose_the_connection)
            .build()
            .await
            .unwrap();

        let report = stopping
            .run_until(broker.source(), STOP.notified())
            .await
            .unwrap();
        eprintln!(
            "REPORT {report:?} acked {} redelivered {} queued {} inflight {}",
            broker.acked(),
            broker.redelivered(),
            broker.queued(),
            broker.in_flight()
        );

        assert_eq!(
            applied(&pool, "acct-1").await,
            [],
            "the successor did not run"
        );
        assert_eq!(broker.acked(), 0, "both go back to the broker");
        let restarted = Inbox::builder(pool.clone())
            .handler(credit)
            .build()
            .await
            .unwrap();
        run_until_applied(&restarted, &pool, broker.source(), 2).await;
        let sequences: Vec<i64> = applied(&pool, "acct-1")
            .await
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(sequences, [1, 2], "after the restart, each once, in order");
    }
}

/// A retry from the store that ends with nothing recorded (here the handler loses its own
/// connection) is put off, longer each time, instead of coming back at every sweep.
mod postgres_store_retry {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use inbox::prelude::*;

    use crate::common::ledger::Credited;

    crate::common::queries::ledger_queries!(sqlx::Postgres, crate::common::postgres);

    /// How many times the handler ran.
    static RUNS: AtomicU32 = AtomicU32::new(0);

    /// Fails its first attempt (recorded), then loses its connection at every retry.
    #[inbox_handler(key = "event_id")]
    async fn fail_then_lose_the_connection(
        ctx: &mut Context<'_, sqlx::Postgres>,
        _msg: Credited,
    ) -> Result<(), HandlerError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        if ctx.attempt() == 1 {
            return Err(HandlerError::msg("the first attempt fails"));
        }
        let end = "SELECT pg_terminate_backend(pg_backend_pid())";
        sqlx::query(end).execute(&mut **ctx.transaction()).await?;
        Ok(())
    }

    fn now_ms() -> i64 {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        i64::try_from(since.as_millis()).unwrap()
    }

    /// When the message is due again, in Unix epoch milliseconds.
    async fn retry_at(pool: &Pool) -> i64 {
        let due = "SELECT retry_at_ms FROM inbox_messages WHERE message_id = 'e-1'";
        sqlx::query_scalar(due).fetch_one(pool).await.unwrap()
    }

    /// Waits until the message is due, then has the store retry it; gives how long it is put off.
    async fn retried_and_put_off(inbox: &Inbox<sqlx::Postgres>, pool: &Pool) -> i64 {
        let wait = retry_at(pool).await - now_ms() + 20;
        tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))).await;
        let runs = RUNS.load(Ordering::SeqCst);
        inbox.replay_requested().await.unwrap();
        assert_eq!(RUNS.load(Ordering::SeqCst), runs + 1, "retried once");
        retry_at(pool).await - now_ms()
    }

    #[tokio::test]
    async fn a_retry_that_loses_its_connection_is_put_off_longer_each_time() {
        let Some(pool) = ledger("store_retry_put_off").await else {
            return;
        };
        let quick =
            RetryPolicy::new(10).backoff(Duration::from_millis(200), Duration::from_secs(60));
        let inbox = Inbox::builder(pool.clone())
            .retry(quick.jitter(0.0))
            .handler(fail_then_lose_the_connection)
            .build()
            .await
            .unwrap();
        let event = Credited::new("e-1", "acct-1", 1, 1);
        inbox
            .dispatch(Envelope::encode("d-1", &event).unwrap())
            .await
            .unwrap_err();

        let first = retried_and_put_off(&inbox, &pool).await;
        let second = retried_and_put_off(&inbox, &pool).await;

        assert!(first > 0, "put off, not due again at once: {first} ms");
        assert!(
            second > first,
            "longer each time: {first} ms, then {second} ms"
        );
    }
}

/// A handler stuck in a statement the server is running (a lock wait, a `pg_sleep`) past its
/// attempt timeout: the server ends the statement, so the failure is recorded at once and the
/// aggregate's stream lock is let go, instead of both waiting for as long as the statement lasts.
mod postgres_stuck_statement {
    use std::time::{Duration, Instant};

    use inbox::prelude::*;

    use crate::common::ledger::Credited;

    crate::common::queries::ledger_queries!(sqlx::Postgres, crate::common::postgres);

    /// Sleeps in the server for half a minute on the first message of an account.
    #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "account")]
    async fn sleeps_in_the_server(
        ctx: &mut Context<'_, sqlx::Postgres>,
        msg: Credited,
    ) -> Result<(), HandlerError> {
        sleep_on(ctx, &msg, 1).await
    }

    /// Under strict ordering, sleeps in the server for half a minute on an account's second
    /// message, which waits parked for the first and is released after it.
    #[inbox_handler(
        key = "event_id",
        sequence = "sequence",
        aggregate = "account",
        ordering = "strict"
    )]
    async fn released_sleeps_in_the_server(
        ctx: &mut Context<'_, sqlx::Postgres>,
        msg: Credited,
    ) -> Result<(), HandlerError> {
        sleep_on(ctx, &msg, 2).await
    }

    async fn sleep_on(
        ctx: &mut Context<'_, sqlx::Postgres>,
        msg: &Credited,
        sequence: i64,
    ) -> Result<(), HandlerError> {
        if msg.sequence == sequence {
            let sleep = "SELECT pg_sleep(30)";
            sqlx::query(sleep).execute(&mut **ctx.transaction()).await?;
        }
        Ok(())
    }

    /// The attempt timeout the tests give their handlers.
    fn one_second() -> RetryPolicy {
        RetryPolicy::new(3).attempt_timeout(Duration::from_secs(1))
    }

    #[tokio::test]
    async fn a_statement_past_the_attempt_timeout_is_ended_by_the_server() {
        let Some(pool) = ledger("stuck_statement").await else {
            return;
        };
        let inbox = Inbox::builder(pool.clone())
            .retry(one_second())
            .handler(sleeps_in_the_server)
            .build()
            .await
            .unwrap();
        let first = Credited::new("e-1", "acct-1", 1, 1);
        let started = Instant::now();

        let error = inbox
            .dispatch(Envelope::encode("d-1", &first).unwrap())
            .await
            .unwrap_err();

        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "the statement ran on for {took:?}"
        );
        assert!(matches!(error, inbox::Error::Handler { .. }), "{error}");
        let second = Credited::new("e-2", "acct-1", 2, 1);
        let next = inbox
            .dispatch(Envelope::encode("d-2", &second).unwrap())
            .await
            .unwrap();
        assert_eq!(
            next[0].outcome,
            Outcome::Processed,
            "the stream lock was let go"
        );
    }

    #[tokio::test]
    async fn a_released_message_past_the_attempt_timeout_is_ended_by_the_server() {
        let Some(pool) = ledger("stuck_release").await else {
            return;
        };
        let inbox = Inbox::builder(pool.clone())
            .retry(one_second())
            .handler(released_sleeps_in_the_server)
            .build()
            .await
            .unwrap();
        let second = Credited::new("e-2", "acct-1", 2, 1);
        inbox
            .dispatch(Envelope::encode("d-2", &second).unwrap())
            .await
            .unwrap();
        let first = Credited::new("e-1", "acct-1", 1, 1);
        let started = Instant::now();

        let handled = inbox
            .dispatch(Envelope::encode("d-1", &first).unwrap())
            .await
            .unwrap();

        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "the released message's statement ran on for {took:?}"
        );
        assert_eq!(
            (handled[0].outcome, handled[0].released),
            (Outcome::Processed, 0)
        );
        let failed = "SELECT status FROM inbox_messages WHERE message_id = 'e-2'";
        let status: String = sqlx::query_scalar(failed).fetch_one(&pool).await.unwrap();
        assert_eq!(status, "failed", "its failure is recorded, to be retried");
    }
}
