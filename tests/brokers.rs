//! One conformance suite for every source: each broker runs the same tests through a
//! [`TestBroker`], which says what the broker promises ([`Features`]); what it does not promise is
//! not tested. The inbox side runs on SQLite.
//!
//! Brokers: the in-memory broker always; NATS JetStream, RabbitMQ, Redis Streams and Kafka when
//! `INBOX_TEST_NATS_URL`, `INBOX_TEST_AMQP_URL`, `INBOX_TEST_REDIS_URL` and
//! `INBOX_TEST_KAFKA_BROKERS` are set, and the PostgreSQL queue when `INBOX_TEST_POSTGRES_URL` is
//! (each required under `CI=true`).

mod common;

use std::time::Duration;

use inbox::prelude::*;
use inbox::{Delivery, MemoryBroker, RunReport, Source};

use common::ledger::Credited;

common::ledger::ledger_handlers!(sqlx::Sqlite, sqlx::SqliteConnection);
common::queries::ledger_queries!(sqlx::Sqlite, crate::common::sqlite);

/// What a broker promises, for the suite to test.
#[derive(Debug, Clone, Copy)]
struct Features {
    /// Counts deliveries: a redelivery comes with a higher attempt.
    counts_attempts: bool,
    /// Can carry a message without the type tag header, which the source then reads as
    /// unreadable.
    carries_untagged: bool,
    /// Takes a delivery back after a timeout unless it is reported in progress.
    redelivers_on_timeout: bool,
    /// Drops a message published again under an id it holds already (JetStream's
    /// `Nats-Msg-Id`), so the consumer never sees the copy.
    drops_republished: bool,
}

/// A broker that counts deliveries, carries any headers, and takes back a delivery whose
/// consumer did not settle it in time.
#[cfg(any(feature = "nats", feature = "redis"))]
const TAKES_BACK_IDLE: Features = Features {
    counts_attempts: true,
    carries_untagged: true,
    redelivers_on_timeout: true,
    drops_republished: false,
};

/// A broker of the test's own (its own stream, queue or key), as the suite drives it.
trait TestBroker: Sized + Send + Sync {
    type Source: Source;
    /// The broker's publisher, for the outbox relay.
    type Sink: inbox::Sink;
    const FEATURES: Features;
    /// How long an unsettled delivery takes to come back once its consumer is gone.
    const REDELIVERY: Duration;
    /// A broker of `test`'s own, or `None` (with a line saying so) when it is not configured.
    async fn new(test: &str) -> Option<Self>;
    /// A consumer in the test's one consumer group.
    async fn source(&self) -> Self::Source;
    /// A consumer in the test's group on connections of its own, as in another process: for a
    /// run that is killed.
    async fn source_of_its_own(&self) -> Self::Source {
        self.source().await
    }
    async fn publish(&self, envelope: &Envelope) -> Result<(), inbox::SinkError>;
    /// The publisher the outbox relay publishes through.
    async fn sink(&self) -> Self::Sink;
    /// Where a relay publishes for this broker's sources to consume it.
    fn destination(&self) -> String;
    /// A destination the broker refuses to take a message for, or `None` where it takes any.
    async fn refused_destination(&self) -> Option<String> {
        None
    }
    /// Publishes `payload` with no type tag (only if `FEATURES.carries_untagged`).
    async fn publish_untagged(&self, payload: &[u8]);
    /// A consumer in a second group, whose broker waits a minute before it takes back a delivery
    /// left unsettled: what comes back sooner was handed back.
    async fn patient_source(&self) -> Self::Source {
        self.source().await
    }
    /// A consumer in a third group to which the broker hands one delivery at a time (a
    /// prefetch, or a bound on unacknowledged deliveries, of one); `None` where the broker
    /// bounds nothing so.
    async fn one_at_a_time_source(&self) -> Option<Self::Source> {
        None
    }
    /// A broker on a server of the suite's own, which the suite restarts; `None` where the suite
    /// does not run this broker itself.
    async fn on_own_server(_test: &str) -> Option<(Self, Server)> {
        None
    }
}

/// A broker server the suite runs itself: on a free port below 32768, with a data directory of
/// its own, stopped (`SIGTERM`) and started again by [`Server::restart`].
struct Server {
    command: Vec<String>,
    port: u16,
    child: std::process::Child,
}

impl Server {
    /// Starts `program` with the arguments `args` makes of a free port and a fresh directory, or
    /// `None` (with a line saying so) when the program is not installed, unless under `CI=true`.
    #[cfg(any(feature = "nats", feature = "redis", feature = "amqp"))]
    async fn start(program: &str, args: impl Fn(u16, &str) -> Vec<String>) -> Option<Server> {
        let port = crate::common::free_port();
        let dir = std::env::temp_dir().join(format!("inbox_broker_{port}_{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a data directory");
        let mut command = vec![program.to_owned()];
        command.extend(args(port, &dir.display().to_string()));
        let Ok(child) = spawn(&command) else {
            return not_installed(program);
        };
        let server = Server {
            command,
            port,
            child,
        };
        server.wait_until_up().await;
        Some(server)
    }

    /// The server's URL in `scheme`.
    #[cfg(any(feature = "nats", feature = "redis", feature = "amqp"))]
    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    async fn wait_until_up(&self) {
        // Two minutes: an Erlang node booting next to the other tests on a loaded machine.
        for _ in 0..2_400 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "`{}` did not come up on port {}",
            self.command[0], self.port
        );
    }

    /// Stops the server as an orderly restart does, and starts it again on its data.
    async fn restart(&mut self) {
        self.stop();
        self.start_again().await;
    }

    /// Stops the server in order (`SIGTERM`) and waits for it to exit; kills it if it has not
    /// within a minute.
    fn stop(&mut self) {
        let pid = self.child.id().to_string();
        let stopped = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(
            stopped.is_ok_and(|status| status.success()),
            "could not stop the server"
        );
        for _ in 0..600 {
            if self.child.try_wait().expect("the server's state").is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
    }

    /// Kills the server's whole process group: a server started by a script (RabbitMQ's) runs
    /// in a process of its own under it.
    fn kill(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
        let _ = self.child.wait();
    }

    /// Starts the stopped server again on its data, and waits until it listens.
    async fn start_again(&mut self) {
        self.child = spawn(&self.command).expect("the server starts again");
        self.wait_until_up().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `None`, with a line saying the restart test needs `program`; a failure under `CI=true`.
#[cfg(any(feature = "nats", feature = "redis", feature = "amqp"))]
fn not_installed<T>(program: &str) -> Option<T> {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI must run the restart test, but `{program}` cannot start"
    );
    crate::common::skip::skip("restart", &format!("the restart test needs `{program}`"));
    None
}

/// Starts `command` in a process group of its own (see [`Server`]'s `drop`).
fn spawn(command: &[String]) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(&command[0])
        .args(&command[1..])
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
}

/// The in-memory broker: one queue, shared by every source of it.
struct Memory(MemoryBroker);

impl TestBroker for Memory {
    type Source = inbox::MemorySource;
    type Sink = MemoryBroker;
    const FEATURES: Features = Features {
        counts_attempts: true,
        carries_untagged: false,
        redelivers_on_timeout: false,
        drops_republished: false,
    };
    const REDELIVERY: Duration = Duration::from_millis(50);

    async fn new(_test: &str) -> Option<Self> {
        Some(Memory(MemoryBroker::new()))
    }

    async fn source(&self) -> Self::Source {
        self.0.source()
    }

    async fn publish(&self, envelope: &Envelope) -> Result<(), inbox::SinkError> {
        self.0.publish(envelope.clone());
        Ok(())
    }

    async fn sink(&self) -> MemoryBroker {
        self.0.clone()
    }

    fn destination(&self) -> String {
        "the queue".to_owned()
    }

    async fn publish_untagged(&self, _payload: &[u8]) {
        unreachable!("the memory broker carries envelopes only")
    }
}

#[cfg(feature = "nats")]
mod jetstream_broker {
    use std::time::Duration;

    use inbox::nats::async_nats::jetstream::{self, stream};
    use inbox::nats::{JetStreamPublisher, JetStreamSource, async_nats};
    use inbox::{Envelope, Sink};

    use super::{Features, Server, TestBroker};

    /// A JetStream stream of the test's own, consumed by the durable consumer `group`.
    pub struct JetStream {
        context: jetstream::Context,
        stream: String,
        publisher: JetStreamPublisher,
    }

    impl TestBroker for JetStream {
        type Source = JetStreamSource;
        type Sink = JetStreamPublisher;
        const FEATURES: Features = Features {
            drops_republished: true,
            ..super::TAKES_BACK_IDLE
        };
        const REDELIVERY: Duration = Duration::from_secs(1);

        async fn new(test: &str) -> Option<Self> {
            Some(Self::connect(&crate::common::nats_url(test)?, test).await)
        }

        async fn on_own_server(test: &str) -> Option<(Self, Server)> {
            let args = |port: u16, dir: &str| {
                let port = port.to_string();
                ["-a", "127.0.0.1", "-p", &port, "-js", "-sd", dir]
                    .map(String::from)
                    .to_vec()
            };
            let server = Server::start("nats-server", args).await?;
            Some((Self::connect(&server.url("nats"), test).await, server))
        }

        async fn source(&self) -> Self::Source {
            JetStreamSource::builder(&self.context, &self.stream, "group")
                .ack_wait(Self::REDELIVERY)
                .build()
                .await
                .expect("build the source")
        }

        async fn patient_source(&self) -> Self::Source {
            JetStreamSource::builder(&self.context, &self.stream, "patient")
                .ack_wait(Duration::from_secs(60))
                .build()
                .await
                .expect("build the source")
        }

        async fn one_at_a_time_source(&self) -> Option<Self::Source> {
            let builder = JetStreamSource::builder(&self.context, &self.stream, "one");
            Some(
                builder
                    .max_ack_pending(1)
                    .build()
                    .await
                    .expect("build the source"),
            )
        }

        async fn publish(&self, envelope: &Envelope) -> Result<(), inbox::SinkError> {
            self.publisher.publish(&self.destination(), envelope).await
        }

        async fn sink(&self) -> JetStreamPublisher {
            self.publisher.clone()
        }

        fn destination(&self) -> String {
            format!("{}.events", self.stream)
        }

        async fn refused_destination(&self) -> Option<String> {
            Some(format!("NO_STREAM_{}.events", self.stream))
        }

        async fn publish_untagged(&self, payload: &[u8]) {
            let subject = format!("{}.events", self.stream);
            let acked = self.context.publish(subject, payload.to_vec().into());
            acked.await.expect("publish").await.expect("publish ack");
        }
    }

    /// A durable consumer deleted under a running source (by an operator, or lost with a server
    /// that kept it in memory) is made again: the source goes on with what is published next,
    /// instead of pulling on a name nobody answers for ever.
    #[tokio::test]
    async fn a_deleted_consumer_is_made_again() {
        use inbox::Source;

        let Some(broker) = JetStream::new("jetstream_consumer_gone").await else {
            return;
        };
        let envelope = crate::numbered;
        broker.publish(&envelope(1)).await.expect("publish");
        let mut source = broker.source().await;
        let first = crate::first_delivery(&mut source).await;
        assert_eq!(first.envelope().id(), "e-1");
        let stream = broker
            .context
            .get_stream(&broker.stream)
            .await
            .expect("the stream");
        stream
            .delete_consumer("group")
            .await
            .expect("delete the consumer");

        broker.publish(&envelope(2)).await.expect("publish");

        let found = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                // Errors come while the pull finds out that its consumer is gone.
                if let Ok(Some(delivery)) = source.next().await
                    && delivery.envelope().id() == "e-2"
                {
                    return;
                }
            }
        });
        found
            .await
            .expect("e-2 delivered once the consumer is back");
    }

    /// What no server will ever take is refused, so the relay counts its attempts and keeps it
    /// failed, instead of trying again for ever: a subject with a space, a message over the
    /// server's `max_payload`, or a header NATS cannot carry (a line break in the type tag, which
    /// the client would panic on).
    #[tokio::test]
    async fn a_message_no_server_takes_is_refused() {
        let Some(url) = crate::common::nats_url("jetstream_refuses") else {
            return;
        };
        let broker = JetStream::connect(&url, "jetstream_refuses").await;
        let envelope = Envelope::new("test.credited", "m-1", b"{}".to_vec());
        let spaced = format!("{} bad", broker.destination());

        let bad_subject = broker.publisher.publish(&spaced, &envelope).await;
        let oversized = Envelope::new("test.credited", "m-2", vec![b'x'; 2 << 20]);
        let oversized = broker
            .publisher
            .publish(&broker.destination(), &oversized)
            .await;

        let broken = Envelope::new("test.\ncredited", "m-3", b"{}".to_vec());
        let broken = broker
            .publisher
            .publish(&broker.destination(), &broken)
            .await;

        for refused in [bad_subject, oversized, broken] {
            assert!(
                matches!(refused, Err(inbox::SinkError::Refused(_))),
                "{refused:?}"
            );
        }
    }

    impl JetStream {
        /// A stream of `test`'s own on the server at `url`.
        async fn connect(url: &str, test: &str) -> Self {
            let client = async_nats::connect(url)
                .await
                .unwrap_or_else(|e| panic!("cannot reach NATS at {url}: {e}"));
            let context = jetstream::new(client);
            let stream = crate::common::unique(test).to_uppercase();
            let config = stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{stream}.>")],
                max_age: Duration::from_secs(600),
                ..Default::default()
            };
            context
                .create_stream(config)
                .await
                .expect("create a stream");
            let publisher = JetStreamPublisher::new(&context);
            JetStream {
                context,
                stream,
                publisher,
            }
        }
    }

    /// A header name NATS cannot carry (here with a space) is refused when the source is built,
    /// naming it: reading it from each delivery would fail every one.
    #[tokio::test]
    async fn a_header_name_nats_cannot_carry_is_refused_when_the_source_is_built() {
        let Some(broker) = JetStream::new("nats_header_names").await else {
            return;
        };
        let names = inbox::HeaderNames {
            message_type: "ce type".into(),
            ..Default::default()
        };
        let builder = JetStreamSource::builder(&broker.context, &broker.stream, "named");

        let built = builder.headers(names).build().await;

        let error = built.err().expect("refused").to_string();
        assert!(error.contains("ce type"), "{error}");
    }
}

#[cfg(feature = "amqp")]
mod rabbitmq_broker {
    use std::sync::Arc;
    use std::time::Duration;

    use inbox::amqp::lapin::options::{BasicPublishOptions, QueueDeclareOptions};
    use inbox::amqp::lapin::types::{AMQPValue, FieldTable};
    use inbox::amqp::lapin::{self, BasicProperties};
    use inbox::amqp::{AmqpConnection, AmqpPublisher, AmqpSource};
    use inbox::{Envelope, Sink};

    use super::{Features, Server, TestBroker};

    /// A quorum queue of the test's own (quorum queues count deliveries).
    pub struct RabbitMq {
        connection: Arc<AmqpConnection>,
        channel: lapin::Channel,
        queue: String,
        publisher: AmqpPublisher,
    }

    impl TestBroker for RabbitMq {
        type Source = AmqpSource;
        type Sink = AmqpPublisher;
        const FEATURES: Features = Features {
            counts_attempts: true,
            carries_untagged: true,
            redelivers_on_timeout: false,
            drops_republished: false,
        };
        const REDELIVERY: Duration = Duration::from_millis(300);

        async fn new(test: &str) -> Option<Self> {
            Some(Self::connect(&crate::common::amqp_url(test)?, test).await)
        }

        async fn on_own_server(test: &str) -> Option<(Self, Server)> {
            crate::common::amqp_url(test)?;
            if !std::path::Path::new(RABBITMQ_SERVER).exists() {
                return super::not_installed(RABBITMQ_SERVER);
            }
            let server = Server::start("env", rabbitmq_node).await?;
            let url = format!("{}/%2f", server.url("amqp"));
            Some((Self::connect(&url, test).await, server))
        }

        async fn source(&self) -> Self::Source {
            AmqpSource::builder(&self.connection, &self.queue)
                .build()
                .await
                .expect("build the source")
        }

        async fn one_at_a_time_source(&self) -> Option<Self::Source> {
            let builder = AmqpSource::builder(&self.connection, &self.queue).prefetch(1);
            Some(builder.build().await.expect("build the source"))
        }

        async fn publish(&self, envelope: &Envelope) -> Result<(), inbox::SinkError> {
            self.publisher.publish(&self.queue, envelope).await
        }

        async fn sink(&self) -> AmqpPublisher {
            AmqpPublisher::new(self.connection.clone(), "")
                .await
                .expect("a publisher")
        }

        fn destination(&self) -> String {
            self.queue.clone()
        }

        async fn refused_destination(&self) -> Option<String> {
            Some(format!("{}-no-such-queue", self.queue))
        }

        async fn publish_untagged(&self, payload: &[u8]) {
            self.publish_raw(payload, BasicProperties::default()).await;
        }
    }

    /// The script that runs a RabbitMQ node in the foreground (a `SIGTERM` stops it in order).
    const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

    /// The `env` arguments that run a RabbitMQ node of its own on `port`, everything it keeps in
    /// `dir`: its configuration (listening on loopback only), no plugins, its data and logs.
    fn rabbitmq_node(port: u16, dir: &str) -> Vec<String> {
        let config = format!("{dir}/rabbitmq.conf");
        let listen = format!("listeners.tcp.local = 127.0.0.1:{port}\n");
        std::fs::write(&config, listen).expect("write the node's configuration");
        let plugins = format!("{dir}/enabled_plugins");
        std::fs::write(&plugins, "[].\n").expect("write the node's plugins");
        let distribution = crate::common::free_port();
        let settings = [
            ("RABBITMQ_CONFIG_FILE", config),
            ("RABBITMQ_ENABLED_PLUGINS_FILE", plugins),
            ("RABBITMQ_NODENAME", format!("inbox{port}@localhost")),
            ("RABBITMQ_NODE_PORT", port.to_string()),
            ("RABBITMQ_DIST_PORT", distribution.to_string()),
            ("RABBITMQ_MNESIA_BASE", format!("{dir}/mnesia")),
            ("RABBITMQ_LOG_BASE", format!("{dir}/log")),
            // A node killed at the end of a test writes its crash dump here, not to the cwd.
            ("ERL_CRASH_DUMP", format!("{dir}/erl_crash.dump")),
        ];
        let settings = settings
            .into_iter()
            .map(|(name, value)| format!("{name}={value}"));
        settings.chain([RABBITMQ_SERVER.to_owned()]).collect()
    }

    impl RabbitMq {
        /// Publishes `payload` to the queue with `properties` as they are, confirmed.
        async fn publish_raw(&self, payload: &[u8], properties: BasicProperties) {
            let options = BasicPublishOptions::default();
            let queue = self.queue.as_str().into();
            let sent = self
                .channel
                .basic_publish("".into(), queue, options, payload, properties);
            sent.await.expect("publish").await.expect("publish confirm");
        }

        /// Declares `exchange`, a direct one that lasts while it is bound, bound to the queue
        /// by its name.
        async fn declare_exchange(&self, exchange: &str) {
            use inbox::amqp::lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
            let options = ExchangeDeclareOptions {
                auto_delete: true,
                ..Default::default()
            };
            let kind = lapin::ExchangeKind::Direct;
            let declared = self.channel.exchange_declare(
                exchange.into(),
                kind,
                options,
                FieldTable::default(),
            );
            declared.await.expect("declare an exchange");
            let queue = self.queue.as_str();
            let bound = self.channel.queue_bind(
                queue.into(),
                exchange.into(),
                queue.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            );
            bound.await.expect("bind the queue");
        }

        /// A quorum queue of `test`'s own on the server at `url`, over a connection that is
        /// dialled again when the server comes back.
        async fn connect(url: &str, test: &str) -> Self {
            let connection = AmqpConnection::connect(url)
                .await
                .unwrap_or_else(|e| panic!("cannot reach RabbitMQ at {url}: {e}"));
            let channel = connection.current().await.expect("the connection");
            let channel = channel.create_channel().await.expect("open a channel");
            let queue = crate::common::unique(test);
            let mut arguments = FieldTable::default();
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            arguments.insert("x-expires".into(), AMQPValue::LongInt(600_000));
            let durable = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            channel
                .queue_declare(queue.as_str().into(), durable, arguments)
                .await
                .expect("declare a queue");
            let publisher = AmqpPublisher::new(connection.clone(), "")
                .await
                .expect("a publisher");
            RabbitMq {
                connection,
                channel,
                queue,
                publisher,
            }
        }
    }

    #[tokio::test]
    async fn the_correlation_id_property_is_the_correlation_id() {
        let Some(broker) = RabbitMq::new("amqp_correlation").await else {
            return;
        };
        let properties = BasicProperties::default()
            .with_type("test.credited".into())
            .with_message_id("m-1".into())
            .with_correlation_id("c-7".into());
        broker.publish_raw(b"{}", properties).await;

        let delivery = crate::first_delivery(&mut broker.source().await).await;

        let envelope = delivery.envelope();
        assert_eq!(envelope.correlation_id(), Some("c-7"), "{envelope:?}");
    }

    /// A source whose connection was closed under it (as a server's restart or a cut network
    /// would) dials the server again and consumes on a new channel: no call waits for ever on
    /// the consumer of the closed connection, and the next message is delivered.
    #[tokio::test]
    async fn a_source_whose_connection_was_closed_dials_again_and_consumes() {
        let Some(broker) = RabbitMq::new("amqp_closed").await else {
            return;
        };
        let url = crate::common::amqp_url("amqp_closed").expect("its URL");
        let connection = AmqpConnection::connect(&url).await.expect("connect");
        let mut source = AmqpSource::builder(&connection, &broker.queue)
            .build()
            .await
            .expect("build the source");
        let closed = connection.current().await.expect("the connection");
        closed.close(200, "gone".into()).await.expect("close");
        let envelope = crate::envelope(&crate::Credited::new("e-1", "acct", 1, 5));
        broker.publish(&envelope).await.expect("publish");

        let mut answers = Vec::new();
        let delivered = loop {
            let next =
                tokio::time::timeout(Duration::from_secs(5), inbox::Source::next(&mut source));
            match next.await.expect("a call that waited for ever") {
                Ok(Some(delivery)) => break delivery,
                other => answers.push(format!("{:?}", other.map(|d| d.is_some()))),
            }
            assert!(answers.len() < 3, "not consuming again: {answers:?}");
        };

        assert_eq!(delivered.envelope().id(), envelope.id(), "{answers:?}");
    }

    /// A source that counts what it hands over.
    struct Counted {
        source: AmqpSource,
        deliveries: std::sync::Arc<std::sync::atomic::AtomicU32>,
    }

    impl inbox::Source for Counted {
        async fn next(&mut self) -> Result<Option<inbox::Delivery>, inbox::SourceError> {
            let next = self.source.next().await;
            if matches!(next, Ok(Some(_))) {
                self.deliveries
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            next
        }
    }

    /// A queue that is full (`x-overflow: reject-publish`) makes RabbitMQ nack a publication:
    /// the broker cannot take the message for now, so the publisher says it is unavailable
    /// (tried again later, without end), not refused (given up on after the retry policy's
    /// attempts).
    #[tokio::test]
    async fn a_message_a_full_queue_nacks_is_tried_again() {
        let Some(broker) = RabbitMq::new("amqp_full").await else {
            return;
        };
        let queue = format!("{}-full", broker.queue);
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongInt(1));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let options = QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        let declared = broker
            .channel
            .queue_declare(queue.as_str().into(), options, arguments);
        declared.await.expect("declare a queue of one message");
        let first = Envelope::new("test.credited", "m-1", b"{}".to_vec());
        let second = Envelope::new("test.credited", "m-2", b"{}".to_vec());

        broker
            .publisher
            .publish(&queue, &first)
            .await
            .expect("room for one");
        let nacked = broker.publisher.publish(&queue, &second).await;

        assert!(
            matches!(nacked, Err(inbox::SinkError::Unavailable(_))),
            "{nacked:?}"
        );
    }

    /// A classic queue counts no deliveries (it says only "redelivered"), so the attempt it gives
    /// stops at 2; the run counts its own hand-backs, and a delivery to reject that the database
    /// cannot keep comes back after 100 ms, 200 ms, 400 ms, 800 ms, 1.6 s: six times in 3 s,
    /// where a delay stuck at 200 ms would bring it fifteen times.
    #[tokio::test]
    async fn on_a_classic_queue_the_delays_of_a_handed_back_delivery_grow() {
        let Some(broker) = RabbitMq::new("amqp_classic").await else {
            return;
        };
        let queue = format!("{}-classic", broker.queue);
        let options = QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        let declared =
            broker
                .channel
                .queue_declare(queue.as_str().into(), options, FieldTable::default());
        declared.await.expect("declare a classic queue");
        let envelope = inbox::Envelope::new("test.unknown", "m-1", b"{}".to_vec());
        let published = broker.publisher.publish(&queue, &envelope);
        published.await.expect("publish");
        let pool = crate::ledger("amqp_classic").await.expect("SQLite");
        let inbox = inbox::Inbox::builder(pool.clone())
            .handler(crate::credit)
            .build()
            .await
            .unwrap();
        pool.close().await;
        let source = AmqpSource::builder(&broker.connection, &queue).build();
        let deliveries = std::sync::Arc::default();
        let counted = Counted {
            source: source.await.expect("build the source"),
            deliveries: std::sync::Arc::clone(&deliveries),
        };

        let stop = tokio::time::sleep(Duration::from_secs(3));
        let report = inbox.run_until(counted, stop).await.unwrap();

        let deliveries = deliveries.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            (2..=7).contains(&deliveries),
            "delivered {deliveries} times in 3 s: {report:?}"
        );
        assert_eq!(report.acked, 0, "{report:?}");
    }

    /// A consumer the server cancelled (its queue deleted under it) is started again on a new
    /// channel once the queue is back: the source says it was cancelled, then delivers what the
    /// new queue holds, instead of waiting for ever on a consumer that has ended.
    #[tokio::test]
    async fn a_consumer_the_server_cancelled_consumes_again() {
        use inbox::Source;

        let Some(broker) = RabbitMq::new("amqp_cancelled").await else {
            return;
        };
        let mut source = broker.source().await;
        let queue = broker.queue.as_str();
        let deleted = broker
            .channel
            .queue_delete(queue.into(), Default::default());
        deleted.await.expect("delete the queue");

        let cancelled = tokio::time::timeout(Duration::from_secs(10), source.next()).await;
        let declared =
            broker
                .channel
                .queue_declare(queue.into(), Default::default(), FieldTable::default());
        declared.await.expect("declare the queue again");
        let envelope = crate::envelope(&crate::Credited::new("e-1", "acct", 1, 5));
        broker.publish(&envelope).await.expect("publish");
        let delivered = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match source.next().await {
                    Ok(Some(delivery)) => return delivery,
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
        let delivered = delivered
            .await
            .expect("delivered from the queue declared again");

        assert!(matches!(cancelled, Ok(Err(_))), "told of the cancellation");
        assert_eq!(delivered.envelope().id(), envelope.id());
    }

    /// A shutdown hands back what the consumer prefetched once each: the consumer is cancelled
    /// first, so the server does not send a message straight back to be handed back again (a
    /// quorum queue counts each delivery against its limit).
    #[tokio::test]
    async fn a_shutdown_hands_back_each_prefetched_message_once() {
        use inbox::Source;

        let Some(broker) = RabbitMq::new("amqp_drain_once").await else {
            return;
        };
        for n in 0..3 {
            let envelope = crate::envelope(&crate::Credited::new(format!("e-{n}"), "acct", n, 1));
            broker.publish(&envelope).await.expect("publish");
        }
        let mut source = broker.source().await;
        let first = crate::first_delivery(&mut source).await;
        tokio::time::sleep(Duration::from_millis(300)).await;

        source.drain().await;
        first
            .nack(Duration::ZERO)
            .await
            .expect("hand the first back");
        let mut again = broker.source().await;
        let mut attempts = Vec::new();
        for _ in 0..3 {
            attempts.push(crate::first_delivery(&mut again).await.attempt());
        }

        assert_eq!(attempts, [2, 2, 2], "each delivered once before");
    }

    /// A message with no id of its own is given the same one at each delivery (its routing key
    /// and a hash of its body), so the run's count of its hand-backs, kept by id, finds it again.
    #[tokio::test]
    async fn a_message_without_an_id_keeps_one_across_deliveries() {
        let Some(broker) = RabbitMq::new("amqp_no_id").await else {
            return;
        };
        let properties = BasicProperties::default().with_type("test.credited".into());
        broker.publish_raw(b"{}", properties).await;
        let mut source = broker.source().await;

        let first = crate::first_delivery(&mut source).await;
        let id = first.envelope().id().to_owned();
        first.nack(Duration::ZERO).await.expect("hand it back");
        let again = crate::first_delivery(&mut source).await;

        assert_eq!(again.attempt(), 2, "the same message, delivered again");
        assert_eq!(again.envelope().id(), id);
    }

    /// A `timestamp` property no clock can hold (any `u64` is allowed on the wire) is no time of
    /// publication: the message is delivered without one, and a sound timestamp is kept.
    #[tokio::test]
    async fn a_timestamp_past_what_the_clock_holds_is_left_out() {
        let Some(broker) = RabbitMq::new("amqp_timestamp").await else {
            return;
        };
        for (id, seconds) in [("m-far", u64::MAX), ("m-now", 1_700_000_000)] {
            let properties = BasicProperties::default()
                .with_type("test.credited".into())
                .with_message_id(id.into())
                .with_timestamp(seconds);
            broker.publish_raw(b"{}", properties).await;
        }
        let mut source = broker.source().await;

        let far = crate::first_delivery(&mut source).await;
        let now = crate::first_delivery(&mut source).await;

        assert_eq!(far.envelope().id(), "m-far");
        assert_eq!(far.envelope().produced_at(), None);
        let sound = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(now.envelope().produced_at(), Some(sound));
    }

    /// What AMQP cannot carry (a routing key, type tag or id past the 255 bytes of a short
    /// string) is refused with the reason, and the publisher goes on with the next message.
    #[tokio::test]
    async fn a_name_past_what_amqp_carries_is_refused() {
        let Some(broker) = RabbitMq::new("amqp_long_names").await else {
            return;
        };
        let long = "x".repeat(256);
        let sound = Envelope::new("test.credited", "m-1", b"{}".to_vec());
        let long_type = Envelope::new(long.as_str(), "m-2", b"{}".to_vec());

        let long_key = broker.publisher.publish(&long, &sound).await;
        let long_type = broker.publish(&long_type).await;

        for refused in [long_key, long_type] {
            let reason = match refused {
                Err(inbox::SinkError::Refused(reason)) => reason,
                other => panic!("refused: {other:?}"),
            };
            assert!(reason.contains("255"), "{reason}");
        }
        broker.publish(&sound).await.expect("the next message goes");
    }

    /// RabbitMQ closes a channel over a publication to an exchange that is not there; the
    /// publisher opens another, so once the exchange is back the next publication goes out
    /// (lapin reopens a channel only after a lost connection: without this, every later
    /// publication would fail).
    #[tokio::test]
    async fn a_channel_the_server_closed_is_opened_again() {
        let Some(broker) = RabbitMq::new("amqp_reopen").await else {
            return;
        };
        let exchange = format!("{}-exchange", broker.queue);
        broker.declare_exchange(&exchange).await;
        let publisher = AmqpPublisher::new(broker.connection.clone(), &exchange);
        let publisher = publisher.await.expect("a publisher");
        let envelope = crate::numbered;
        let options = inbox::amqp::lapin::options::ExchangeDeleteOptions::default();
        let deleted = broker
            .channel
            .exchange_delete(exchange.as_str().into(), options);
        deleted.await.expect("delete the exchange");

        let lost = publisher.publish(&broker.queue, &envelope(1)).await;
        broker.declare_exchange(&exchange).await;
        let sent = publisher.publish(&broker.queue, &envelope(2)).await;

        assert!(lost.is_err(), "published to no exchange: {lost:?}");
        sent.expect("published once the exchange is back");
        let delivery = crate::first_delivery(&mut broker.source().await).await;
        assert_eq!(delivery.envelope().id(), "e-2");
    }

    /// An `AmqpConnection` is back within seconds of a server that was away for long: it dials
    /// when asked, on no schedule of its own that could leave a server back after 35 s unseen
    /// for long.
    #[tokio::test]
    async fn a_connection_is_back_soon_after_a_server_away_for_long() {
        let Some((broker, mut server)) = RabbitMq::on_own_server("amqp_away").await else {
            return;
        };
        let envelope = crate::numbered;
        broker.publish(&envelope(0)).await.expect("publish");

        server.stop();
        tokio::time::sleep(Duration::from_secs(35)).await;
        server.start_again().await;
        let back = std::time::Instant::now();
        super::suite::publish_eventually(&broker, &envelope(1)).await;

        let late = back.elapsed();
        assert!(
            late < Duration::from_secs(10),
            "the connection came back {late:?} after the server"
        );
    }

    /// A server killed (`SIGKILL`: the socket is reset, with no `connection.close` before it)
    /// and started again: the source that was consuming dials again by itself (what comes after
    /// is published on a connection of its own) and delivers it, where lapin's own recovery
    /// could wait for ever with the consumer silent. (A classic queue, declared again after the
    /// kill: a node killed moments after a queue was declared may come back without it, or, for
    /// a quorum queue, with no leader to take anything.)
    #[tokio::test]
    async fn a_source_consumes_again_after_its_server_was_killed() {
        let Some((broker, mut server)) = RabbitMq::on_own_server("amqp_killed").await else {
            return;
        };
        let queue = format!("{}-classic", broker.queue);
        let declared = declare_classic(&broker.channel, &queue);
        declared.await.expect("declare a classic queue");
        let mut source = AmqpSource::builder(&broker.connection, &queue)
            .build()
            .await
            .expect("build the source");
        let before = crate::numbered(0);
        let publish = broker.publisher.publish(&queue, &before);
        publish.await.expect("publish");
        crate::first_delivery(&mut source).await;

        server.kill();
        server.start_again().await;
        let url = format!("{}/%2f", server.url("amqp"));
        let after = crate::numbered(1);
        let published = tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                let publish = publish_on_a_connection_of_its_own(&url, &queue, &after);
                if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), publish).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        published
            .await
            .expect("published within two minutes of the restart");
        let delivered = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match inbox::Source::next(&mut source).await {
                    Ok(Some(delivery)) if delivery.envelope().id() == after.id() => {
                        return delivery;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });

        delivered
            .await
            .expect("the message published after, within a minute");
    }

    /// Declares `queue`, a durable classic queue, on `channel`.
    async fn declare_classic(channel: &lapin::Channel, queue: &str) -> Result<(), lapin::Error> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let declared = channel.queue_declare(queue.into(), durable, FieldTable::default());
        declared.await.map(drop)
    }

    /// Declares `queue` again and publishes `envelope` to it, on a new connection to `url`, or
    /// says why not.
    async fn publish_on_a_connection_of_its_own(
        url: &str,
        queue: &str,
        envelope: &Envelope,
    ) -> Result<(), String> {
        let connection = AmqpConnection::connect(url).await;
        let connection = connection.map_err(|e| e.to_string())?;
        let channel = connection.current().await.map_err(|e| e.to_string())?;
        let channel = channel.create_channel().await.map_err(|e| e.to_string())?;
        let declared = declare_classic(&channel, queue).await;
        declared.map_err(|e| e.to_string())?;
        let publisher = AmqpPublisher::new(connection, "").await;
        let publisher = publisher.map_err(|e| e.to_string())?;
        let published = publisher.publish(queue, envelope).await;
        published.map_err(|e| e.to_string())
    }
}

#[cfg(feature = "redis")]
mod redis_broker {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use inbox::redis::redis::{self, AsyncCommands};
    use inbox::redis::{RedisStreamPublisher, RedisStreamSource};
    use inbox::{Envelope, Sink, Source};

    use super::{Features, Server, TestBroker};

    /// A stream of the test's own, consumed by the group `group`, each source a consumer of its
    /// own.
    pub struct RedisStreams {
        client: redis::Client,
        stream: String,
        publisher: RedisStreamPublisher,
        consumers: AtomicUsize,
    }

    impl TestBroker for RedisStreams {
        type Source = RedisStreamSource;
        type Sink = RedisStreamPublisher;
        const FEATURES: Features = super::TAKES_BACK_IDLE;
        const REDELIVERY: Duration = Duration::from_secs(1);

        async fn new(test: &str) -> Option<Self> {
            Some(Self::connect(&crate::common::redis_url(test)?, test).await)
        }

        async fn on_own_server(test: &str) -> Option<(Self, Server)> {
            let args = |port: u16, dir: &str| {
                let port = port.to_string();
                let flags = [
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    &port,
                    "--dir",
                    dir,
                    "--save",
                    "",
                ];
                let durable = ["--appendonly", "yes", "--appendfsync", "always"];
                flags
                    .iter()
                    .chain(&durable)
                    .map(|s| s.to_string())
                    .collect()
            };
            let server = Server::start("redis-server", args).await?;
            Some((Self::connect(&server.url("redis"), test).await, server))
        }

        async fn source(&self) -> Self::Source {
            let consumer = format!(
                "consumer-{}",
                self.consumers.fetch_add(1, Ordering::Relaxed)
            );
            RedisStreamSource::builder(&self.client, &self.stream, "group", &consumer)
                .visibility_timeout(Self::REDELIVERY)
                .build()
                .await
                .expect("build the source")
        }

        async fn patient_source(&self) -> Self::Source {
            let consumer = format!("patient-{}", self.consumers.fetch_add(1, Ordering::Relaxed));
            RedisStreamSource::builder(&self.client, &self.stream, "patient", &consumer)
                .visibility_timeout(Duration::from_secs(60))
                .build()
                .await
                .expect("build the source")
        }

        async fn publish(&self, envelope: &Envelope) -> Result<(), inbox::SinkError> {
            self.publisher.publish(&self.stream, envelope).await
        }

        async fn sink(&self) -> RedisStreamPublisher {
            self.publisher.clone()
        }

        fn destination(&self) -> String {
            self.stream.clone()
        }

        async fn refused_destination(&self) -> Option<String> {
            let key = format!("{}-a-string", self.stream);
            let mut connection = self
                .client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let _: () = connection
                .set_ex(&key, "not a stream", 600)
                .await
                .expect("SET");
            Some(key)
        }

        async fn publish_untagged(&self, payload: &[u8]) {
            let mut connection = self
                .client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let _: String = connection
                .xadd(&self.stream, "*", &[("payload", payload)])
                .await
                .expect("XADD");
        }
    }

    impl RedisStreams {
        /// A stream of `test`'s own on the server at `url`.
        async fn connect(url: &str, test: &str) -> Self {
            let client =
                redis::Client::open(url).unwrap_or_else(|e| panic!("bad Redis URL {url}: {e}"));
            let publisher = RedisStreamPublisher::new(&client)
                .await
                .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}"));
            RedisStreams {
                client,
                stream: crate::common::unique(test),
                publisher,
                consumers: AtomicUsize::new(0),
            }
        }
    }
    /// A run that stops while its read blocks drops that call to `next`, not the read: what the
    /// server gives the read meanwhile is handed back by `drain`, and another consumer takes it
    /// at once, not after the visibility timeout.
    #[tokio::test]
    async fn an_entry_read_as_the_run_stops_is_handed_back_at_once() {
        let Some(broker) = RedisStreams::new("redis_read_at_stop").await else {
            return;
        };
        let patient = |consumer: &'static str| {
            let builder = RedisStreamSource::builder(&broker.client, &broker.stream, "g", consumer);
            builder.visibility_timeout(Duration::from_secs(30)).build()
        };
        let mut stopping = patient("stopping").await.expect("build the source");
        let read = tokio::time::timeout(Duration::from_millis(300), stopping.next()).await;
        assert!(read.is_err(), "nothing to read yet");

        broker.publish(&crate::numbered(1)).await.expect("publish");
        stopping.drain().await;

        let mut next = patient("next").await.expect("build the source");
        let taken = tokio::time::timeout(Duration::from_secs(3), next.next()).await;
        let taken = taken
            .ok()
            .and_then(|next| next.expect("the source answers"));
        let id = taken.map(|delivery| delivery.envelope().id().to_owned());
        assert_eq!(id.as_deref(), Some("e-1"), "handed back at once");
    }

    /// Adds an entry with `fields` as they are (bytes, UTF-8 or not) to the stream.
    async fn add_raw(broker: &RedisStreams, fields: &[(&[u8], &[u8])]) {
        let connection = broker.client.get_multiplexed_async_connection();
        let connection = &mut connection.await.expect("connect");
        let added: redis::RedisResult<String> = connection.xadd(&broker.stream, "*", fields).await;
        added.expect("XADD");
    }

    /// A server that may not take writes for now (`NOREPLICAS`: fewer replicas than
    /// `min-replicas-to-write`; `MASTERDOWN` alike) makes a publication unavailable, tried again
    /// later, not refused and given up on.
    #[tokio::test]
    async fn a_server_without_its_replicas_makes_a_publication_wait() {
        let Some((broker, _server)) = RedisStreams::on_own_server("redis_no_replicas").await else {
            return;
        };
        let connection = broker.client.get_multiplexed_async_connection();
        let connection = &mut connection.await.expect("connect");
        let set: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg(&["SET", "min-replicas-to-write", "1"])
            .query_async(connection)
            .await;
        set.expect("CONFIG SET");

        let envelope = Envelope::new("test.credited", "m-1", b"{}".to_vec());
        let published = broker.publish(&envelope).await;

        assert!(
            matches!(published, Err(inbox::SinkError::Unavailable(_))),
            "{published:?}"
        );
    }

    /// An entry with a field name or a type tag that is not UTF-8 costs no other entry of the
    /// read: the one with an odd field name is delivered without that header, the one with an
    /// odd type tag is a delivery the run keeps as rejected, and the entries around them come.
    #[tokio::test]
    async fn an_entry_that_is_not_utf8_costs_no_other_entry() {
        let Some(broker) = RedisStreams::new("redis_not_utf8").await else {
            return;
        };
        let entry = |id: &'static [u8], extra: (&'static [u8], &'static [u8])| {
            [
                (&b"ce-type"[..], &b"test.credited"[..]),
                (b"ce-id", id),
                extra,
            ]
        };
        add_raw(&broker, &entry(b"e-1", (b"payload", b"{}"))).await;
        add_raw(&broker, &entry(b"e-2", (b"odd-\xff-name", b"v"))).await;
        add_raw(&broker, &entry(b"e-3", (b"payload", b"{}"))).await;
        add_raw(&broker, &[(b"ce-type", b"\xfe\xff"), (b"ce-id", b"e-4")]).await;
        let mut source = broker.source().await;

        let mut delivered = Vec::new();
        for _ in 0..4 {
            let delivery = crate::first_delivery(&mut source).await;
            let envelope = delivery.envelope();
            let unreadable = delivery.unreadable_reason().map(str::to_owned);
            delivered.push((envelope.id().to_owned(), unreadable));
        }

        let ids: Vec<&str> = delivered.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["e-1", "e-2", "e-3", "e-4"]);
        assert!(
            delivered[..3]
                .iter()
                .all(|(_, unreadable)| unreadable.is_none())
        );
        let reason = delivered[3]
            .1
            .as_deref()
            .expect("the odd type tag is refused");
        assert!(reason.contains("`ce-type` field is not UTF-8"), "{reason}");
    }

    /// A group that went with its stream (deleted, or lost by a server that kept nothing) is
    /// created again: the entries a publisher adds after are consumed, instead of every read
    /// failing for good.
    #[tokio::test]
    async fn a_group_that_went_with_its_stream_comes_back() {
        let Some(broker) = RedisStreams::new("redis_group_gone").await else {
            return;
        };
        let envelope = crate::numbered;
        broker.publish(&envelope(1)).await.expect("publish");
        let mut source = broker.source().await;
        assert_eq!(
            crate::first_delivery(&mut source).await.envelope().id(),
            "e-1"
        );
        let connection = broker.client.get_multiplexed_async_connection();
        let connection = &mut connection.await.expect("connect");
        let deleted: redis::RedisResult<i64> = connection.del(&broker.stream).await;
        deleted.expect("DEL");

        broker.publish(&envelope(2)).await.expect("publish");

        assert_eq!(
            crate::first_delivery(&mut source).await.envelope().id(),
            "e-2"
        );
    }

    /// A pass for abandoned entries goes on where Redis stopped looking (it looks at no more than
    /// ten times `count` pending entries a call): an abandoned entry behind more live ones than
    /// that is still taken back, within the visibility timeout of the live ones.
    #[tokio::test]
    async fn an_abandoned_entry_behind_many_live_ones_is_taken_back() {
        use inbox::Source;

        let Some(broker) = RedisStreams::new("redis_abandoned_far").await else {
            return;
        };
        const ENTRIES: usize = 12;
        for n in 1..=ENTRIES {
            let envelope = Envelope::new("t", format!("e-{n}"), b"{}".to_vec());
            broker.publish(&envelope).await.expect("publish");
        }
        let mut live = RedisStreamSource::builder(&broker.client, &broker.stream, "group", "live")
            .build()
            .await
            .expect("build the source");
        for _ in 0..ENTRIES {
            live.next().await.expect("read").expect("an entry");
        }
        let mut connection = broker
            .client
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let range: redis::streams::StreamRangeReply =
            connection.xrange_all(&broker.stream).await.expect("XRANGE");
        let last = &range.ids.last().expect("entries").id;
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(&broker.stream)
            .arg("group")
            .arg("gone")
            .arg(0)
            .arg(last)
            .arg("IDLE")
            .arg(600_000)
            .arg("JUSTID")
            .query_async(&mut connection)
            .await
            .expect("XCLAIM");

        let mut rescuer =
            RedisStreamSource::builder(&broker.client, &broker.stream, "group", "rescuer")
                .visibility_timeout(Duration::from_secs(8))
                .count(1)
                .build()
                .await
                .expect("build the source");
        let taken = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(delivery) = rescuer.next().await.expect("read") {
                    return delivery.envelope().id().to_owned();
                }
            }
        })
        .await;
        assert_eq!(
            taken.as_deref(),
            Ok(format!("e-{ENTRIES}").as_str()),
            "the abandoned entry, before the live ones go idle"
        );
    }
}

#[cfg(feature = "kafka")]
mod kafka_broker {
    use std::time::Duration;

    use inbox::kafka::rdkafka::ClientConfig;
    use inbox::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use inbox::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
    use inbox::kafka::{KafkaPublisher, KafkaSource};
    use inbox::{Envelope, Sink};

    use super::{Features, TestBroker};

    /// Partitions of each test's topic: one, so that the suite's messages come in the order they
    /// were published, as on the other brokers (a test that stops once its tagged message applied
    /// would otherwise stop before a message on another partition arrived).
    const PARTITIONS: i32 = 1;

    /// A topic of the test's own, with [`PARTITIONS`] partitions, consumed by the group `group`.
    pub struct Kafka {
        brokers: String,
        topic: String,
        publisher: KafkaPublisher,
    }

    impl Kafka {
        fn config(&self) -> ClientConfig {
            let mut config = ClientConfig::new();
            config.set("bootstrap.servers", &self.brokers);
            config
        }

        fn consumer(&self, group: &str) -> KafkaSource {
            let mut config = self.config();
            config
                .set("group.id", format!("{group}-{}", self.topic))
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500");
            KafkaSource::builder(&config, &[&self.topic])
                .commit_interval(Duration::from_millis(100))
                .build()
                .expect("build the source")
        }
    }

    impl TestBroker for Kafka {
        type Source = KafkaSource;
        type Sink = KafkaPublisher;
        const FEATURES: Features = Features {
            counts_attempts: true,
            carries_untagged: true,
            redelivers_on_timeout: false,
            drops_republished: false,
        };
        const REDELIVERY: Duration = Duration::from_secs(3);

        async fn new(test: &str) -> Option<Self> {
            let brokers = crate::common::kafka_brokers(test)?;
            let topic = crate::common::unique(test);
            let mut config = ClientConfig::new();
            config.set("bootstrap.servers", &brokers);
            let admin: AdminClient<_> = config.create().expect("an admin client");
            let new_topic = NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1));
            let created = admin
                .create_topics([&new_topic], &AdminOptions::new())
                .await;
            for result in created.unwrap_or_else(|e| panic!("cannot reach Kafka at {brokers}: {e}"))
            {
                result.unwrap_or_else(|(topic, e)| panic!("cannot create topic {topic}: {e}"));
            }
            let publisher = KafkaPublisher::new(&config).expect("a producer");
            Some(Kafka {
                brokers,
                topic,
                publisher,
            })
        }

        async fn source(&self) -> Self::Source {
            self.consumer("group")
        }

        async fn patient_source(&self) -> Self::Source {
            self.consumer("patient")
        }

        async fn publish(&self, envelope: &Envelope) -> Result<(), inbox::SinkError> {
            self.publisher.publish(&self.topic, envelope).await
        }

        async fn sink(&self) -> KafkaPublisher {
            self.publisher.clone()
        }

        fn destination(&self) -> String {
            self.topic.clone()
        }

        async fn publish_untagged(&self, payload: &[u8]) {
            let producer: FutureProducer = self.config().create().expect("a producer");
            let record = FutureRecord::<(), _>::to(&self.topic).payload(payload);
            let sent = producer.send(record, Duration::from_secs(10)).await;
            sent.map_err(|(e, _)| e).expect("publish");
        }
    }
}

#[cfg(feature = "postgres-queue")]
mod postgres_queue_broker {
    use std::time::Duration;

    use inbox::postgres_queue::{PgQueuePublisher, PgQueueSource};
    use inbox::{Envelope, Sink};

    use super::{Features, TestBroker};

    /// A queue of the test's own, in a PostgreSQL schema of the test's own.
    pub struct PostgresQueue {
        pool: sqlx::PgPool,
        queue: String,
        publisher: PgQueuePublisher,
    }

    impl PostgresQueue {
        fn consumer(&self, visibility: Duration) -> inbox::postgres_queue::PgQueueSourceBuilder {
            self.consumer_on(&self.pool, visibility)
        }

        /// A consumer of the test's queue through `pool`.
        fn consumer_on(
            &self,
            pool: &sqlx::PgPool,
            visibility: Duration,
        ) -> inbox::postgres_queue::PgQueueSourceBuilder {
            PgQueueSource::builder(pool, &self.queue)
                .visibility_timeout(visibility)
                .poll_interval(Duration::from_millis(100))
        }
    }

    impl TestBroker for PostgresQueue {
        type Source = PgQueueSource;
        type Sink = PgQueuePublisher;
        const FEATURES: Features = Features {
            counts_attempts: true,
            carries_untagged: false,
            redelivers_on_timeout: true,
            drops_republished: false,
        };
        const REDELIVERY: Duration = Duration::from_secs(1);

        async fn new(test: &str) -> Option<Self> {
            let pool = crate::common::postgres(test).await?;
            let publisher = PgQueuePublisher::new(&pool);
            Some(PostgresQueue {
                pool,
                queue: crate::common::unique(test),
                publisher,
            })
        }

        async fn source(&self) -> Self::Source {
            let source = self.consumer(Self::REDELIVERY).build();
            source.await.expect("build the source")
        }

        async fn source_of_its_own(&self) -> Self::Source {
            let options = (*self.pool.connect_options()).clone();
            let pool = sqlx::PgPool::connect_with(options).await.expect("connect");
            let source = self.consumer_on(&pool, Self::REDELIVERY).build();
            source.await.expect("build the source")
        }

        async fn patient_source(&self) -> Self::Source {
            let source = self.consumer(Duration::from_secs(60)).build();
            source.await.expect("build the source")
        }

        async fn publish(&self, envelope: &Envelope) -> Result<(), inbox::SinkError> {
            self.publisher.publish(&self.queue, envelope).await
        }

        async fn sink(&self) -> PgQueuePublisher {
            self.publisher.clone()
        }

        fn destination(&self) -> String {
            self.queue.clone()
        }

        async fn publish_untagged(&self, _payload: &[u8]) {
            unreachable!("the queue's type tag is a column that cannot be empty")
        }
    }
}

/// The next delivery within `wait`, if one comes.
async fn next_within<S: Source>(source: &mut S, wait: Duration) -> Option<Delivery> {
    match tokio::time::timeout(wait, source.next()).await {
        Ok(next) => next.expect("the source answers"),
        Err(_) => None,
    }
}

/// Publishes the event `e-1` of account `acct`, crediting `amount`.
async fn publish_one<B: TestBroker>(broker: &B, amount: i64) {
    broker
        .publish(&envelope(&Credited::new("e-1", "acct", 1, amount)))
        .await
        .expect("publish");
}

/// The first delivery, which must come within ten seconds.
async fn first_delivery<S: Source>(source: &mut S) -> Delivery {
    next_within(source, Duration::from_secs(10))
        .await
        .expect("a delivery")
}

/// Nothing comes to a new consumer of the group, for three redelivery timeouts.
async fn assert_not_delivered_again<B: TestBroker>(broker: &B, what: &str) {
    let mut source = broker.source().await;
    let again = next_within(&mut source, B::REDELIVERY * 3).await;
    assert!(again.is_none(), "{what}: {again:?}");
}

/// The `n`-th of a test's plain messages: id `e-<n>`, an empty JSON object.
#[cfg(any(feature = "nats", feature = "amqp", feature = "redis"))]
fn numbered(n: u32) -> Envelope {
    Envelope::new("test.credited", format!("e-{n}"), b"{}".to_vec())
}

fn envelope(event: &Credited) -> Envelope {
    Envelope::encode(format!("delivery-{}", event.event_id), event).expect("encode")
}

/// A stream of `accounts × per_account` events, every third one twice, shuffled.
fn shuffled_stream(accounts: usize, per_account: i64) -> (Vec<Credited>, usize) {
    let mut stream = Vec::new();
    let mut distinct = 0;
    for account in 0..accounts {
        for sequence in 1..=per_account {
            let event = Credited::new(
                format!("acct-{account}-{sequence}"),
                format!("acct-{account}"),
                sequence,
                sequence,
            );
            distinct += 1;
            if distinct % 3 == 0 {
                stream.push(event.clone());
            }
            stream.push(event);
        }
    }
    common::shuffle(&mut stream, 7);
    (stream, distinct)
}

/// Publishes `stream`, the `n`-th event as delivery `n`.
async fn publish_all<B: TestBroker>(broker: &B, stream: &[Credited]) {
    for (n, event) in stream.iter().enumerate() {
        let envelope = Envelope::encode(format!("delivery-{n}"), event).expect("encode");
        broker.publish(&envelope).await.expect("publish");
    }
}

/// Every account applied 1..=per_account once each, in order, and holds their sum.
async fn assert_applied_in_order(pool: &Pool, accounts: usize, per_account: i64) {
    for account in 0..accounts {
        let account = format!("acct-{account}");
        let applied: Vec<i64> = applied(pool, &account)
            .await
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(applied, (1..=per_account).collect::<Vec<_>>(), "{account}");
        assert_eq!(
            balance(pool, &account).await,
            (1..=per_account).sum::<i64>(),
            "{account}"
        );
    }
}

/// The tests, generic over the broker.
mod suite {
    use super::*;

    /// Says, where a reader sees it, that a test does not apply to a broker.
    pub fn not_promised<B: TestBroker>(what: &str) {
        let why = format!("{} never {what}", std::any::type_name::<B>());
        crate::common::skip::skip("not promised", &why);
    }

    pub async fn consumes_what_was_published_with_payload_and_headers<B: TestBroker>() {
        let Some(broker) = B::new("conformance_publish").await else {
            return;
        };
        for n in 0..10 {
            let event = Credited::new(format!("e-{n}"), "acct", n, n);
            broker
                .publish(&envelope(&event).with_header("trace", format!("t-{n}")))
                .await
                .expect("publish");
        }
        let mut source = broker.source().await;

        let mut seen = Vec::new();
        for _ in 0..10 {
            let delivery = next_within(&mut source, Duration::from_secs(10))
                .await
                .expect("a delivery");
            let message = delivery.envelope();
            assert_eq!(message.message_type(), "test.credited");
            let event: Credited = message.decode().expect("the payload decodes");
            assert_eq!(message.id(), format!("delivery-{}", event.event_id));
            assert_eq!(
                message.headers().get("trace"),
                Some(&format!("t-{}", event.sequence))
            );
            assert_eq!(delivery.attempt(), 1);
            seen.push(event.sequence);
            delivery.ack().await.expect("ack");
        }
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
    }

    pub async fn a_nacked_delivery_comes_again<B: TestBroker>() {
        let Some(broker) = B::new("conformance_nack").await else {
            return;
        };
        publish_one(&broker, 1).await;
        let mut source = broker.source().await;

        let first = first_delivery(&mut source).await;
        first.nack(Duration::from_millis(200)).await.expect("nack");
        let again = next_within(&mut source, Duration::from_secs(10))
            .await
            .expect("redelivered");

        assert_eq!(again.envelope().id(), "delivery-e-1");
        if B::FEATURES.counts_attempts {
            assert_eq!(again.attempt(), 2);
        }
        again.ack().await.expect("ack");
    }

    pub async fn an_unsettled_delivery_goes_to_the_next_consumer<B: TestBroker>() {
        let Some(broker) = B::new("conformance_crash").await else {
            return;
        };
        publish_one(&broker, 1).await;
        let mut crashed = broker.source().await;
        let taken = first_delivery(&mut crashed).await;
        drop((taken, crashed));

        let mut next = broker.source().await;
        let again = next_within(&mut next, B::REDELIVERY * 5)
            .await
            .expect("redelivered after the crash");

        assert_eq!(again.envelope().id(), "delivery-e-1");
        again.ack().await.expect("ack");
    }

    pub async fn an_acked_delivery_never_comes_again<B: TestBroker>() {
        let Some(broker) = B::new("conformance_acked").await else {
            return;
        };
        publish_one(&broker, 1).await;
        let mut source = broker.source().await;
        let delivery = first_delivery(&mut source).await;
        delivery.ack().await.expect("ack");
        // The consumer leaves before the next one comes: a broker that hands back what a consumer
        // leaves unsettled would hand this one back if the ack had not counted.
        drop(source);

        assert_not_delivered_again(&broker, "redelivered after its ack").await;
    }

    pub async fn a_shuffled_duplicated_stream_keeps_the_ledger_exact<B: TestBroker>() {
        let Some(broker) = B::new("conformance_ledger").await else {
            return;
        };
        let Some(pool) = ledger("conformance_ledger").await else {
            return;
        };
        let (accounts, per_account) = (10, 10);
        let (stream, distinct) = shuffled_stream(accounts, per_account);
        publish_all(&broker, &stream).await;
        let inbox = Inbox::builder(pool.clone())
            .consumer("ledger")
            .handler(credit_strict)
            .build()
            .await
            .unwrap();

        let report = run_until_applied(&inbox, &pool, broker.source().await, distinct as i64).await;

        assert_eq!(count(&pool, "applied").await, distinct as i64, "{report:?}");
        assert_applied_in_order(&pool, accounts, per_account).await;
    }

    pub async fn two_consumers_in_one_group_apply_each_message_once<B: TestBroker>() {
        let Some(broker) = B::new("conformance_group").await else {
            return;
        };
        let Some(pool) = ledger("conformance_group").await else {
            return;
        };
        let (accounts, per_account) = (6, 10);
        let (stream, distinct) = shuffled_stream(accounts, per_account);
        publish_all(&broker, &stream).await;
        let other_pool = second_pool(&pool).await;
        let build = |pool: &Pool| {
            Inbox::builder(pool.clone())
                .consumer("ledger")
                .handler(credit_strict)
                .build()
        };
        let (one, two) = (
            build(&pool).await.unwrap(),
            build(&other_pool).await.unwrap(),
        );

        let (first, second) = tokio::join!(
            run_until_applied(&one, &pool, broker.source().await, distinct as i64),
            run_until_applied(&two, &other_pool, broker.source().await, distinct as i64),
        );

        let applied_by = |report: &RunReport| {
            report.handler_calls_with(Outcome::Processed)
                + report.handler_calls_with(Outcome::Released)
        };
        assert_eq!(
            applied_by(&first) + applied_by(&second),
            distinct as u64,
            "{first:?} {second:?}"
        );
        assert_eq!(count(&pool, "applied").await, distinct as i64);
        assert_applied_in_order(&pool, accounts, per_account).await;
    }

    /// A failure the inbox recorded is retried from its store, so its delivery is settled at
    /// once: held for its backoff, it would take the broker's one slot (a prefetch, a bound on
    /// unacknowledged deliveries), and as many failing messages as the bound would stop the
    /// consumer.
    pub async fn a_recorded_failure_does_not_hold_up_the_deliveries_behind_it<B: TestBroker>() {
        let Some(broker) = B::new("conformance_recorded_failure").await else {
            return;
        };
        let Some(source) = broker.one_at_a_time_source().await else {
            return not_promised::<B>("bounds unsettled deliveries to one");
        };
        let pool = ledger("conformance_recorded_failure")
            .await
            .expect("SQLite");
        freeze(&pool, "frozen", true).await;
        for event in [
            Credited::new("e-1", "frozen", 1, 5),
            Credited::new("e-2", "acct", 1, 7),
        ] {
            broker.publish(&envelope(&event)).await.expect("publish");
        }
        let an_hour = Duration::from_secs(3_600);
        let inbox = Inbox::builder(pool.clone())
            .retry(inbox::RetryPolicy::new(5).backoff(an_hour, an_hour))
            .handler(credit)
            .build()
            .await
            .unwrap();

        let report = run_until_applied(&inbox, &pool, source, 1).await;

        assert_eq!(balance(&pool, "acct").await, 7, "{report:?}");
        let failed = status(&pool, "credit", "e-1").await;
        assert_eq!(
            failed.as_deref(),
            Some("failed"),
            "kept for the store's retry"
        );
    }

    pub async fn a_delivery_without_a_type_tag_is_kept_as_rejected<B: TestBroker>() {
        if !B::FEATURES.carries_untagged {
            return not_promised::<B>("carries messages without a type tag");
        }
        let Some(broker) = B::new("conformance_untagged").await else {
            return;
        };
        let Some(pool) = ledger("conformance_untagged").await else {
            return;
        };
        broker.publish_untagged(b"{\"no\": \"type\"}").await;
        publish_one(&broker, 5).await;
        let inbox = Inbox::builder(pool.clone())
            .handler(credit)
            .build()
            .await
            .unwrap();

        let report = run_until_applied(&inbox, &pool, broker.source().await, 1).await;

        let rejected = inbox.rejected().await.unwrap();
        assert_eq!(rejected.len(), 1, "{report:?}");
        assert_eq!(rejected[0].payload, b"{\"no\": \"type\"}");
        assert!(
            rejected[0].reason.contains("has no `ce-type`"),
            "{}",
            rejected[0].reason
        );
        assert_eq!(balance(&pool, "acct").await, 5);
        assert_not_delivered_again(&broker, "a kept delivery was delivered again").await;
    }

    /// The event ids whose first attempt stalls for good.
    static STALLED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

    /// Credits; the first attempt at an event stalls for an hour, inside its transaction.
    #[inbox_handler(key = "event_id", aggregate = "account", name = "stall_once")]
    async fn stall_once(
        tx: &mut sqlx::SqliteConnection,
        msg: Credited,
    ) -> Result<(), HandlerError> {
        let first = {
            let mut stalled = STALLED.lock().unwrap();
            let first = !stalled.contains(&msg.event_id);
            stalled.push(msg.event_id.clone());
            first
        };
        if first {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
        }
        apply_credit(tx, &msg).await
    }

    /// Runs `stall_once` (batched as `batch` says) on `broker` with a pool of its own, and kills
    /// that run once the first attempt at `event_id` stalled; then runs it again on `pool` until
    /// `applied` messages are, and returns that run's report.
    async fn kill_at_the_stall_then_run_again<B: TestBroker>(
        broker: &B,
        pool: &Pool,
        batch: Option<inbox::Batch>,
        event_id: &str,
        applied: i64,
    ) -> RunReport {
        let stalling = async |pool: Pool| {
            let builder = Inbox::builder(pool);
            let builder = match batch {
                Some(batch) => builder.batch(batch),
                None => builder,
            };
            builder
                .handler(stall_once)
                .build()
                .await
                .expect("build the inbox")
        };
        let killed = async || {
            let inbox = stalling(second_pool(pool).await).await;
            (inbox, broker.source_of_its_own().await)
        };
        common::run_then_kill(killed, async {
            let stalled = async {
                while !STALLED.lock().unwrap().iter().any(|id| id == event_id) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            };
            let within = tokio::time::timeout(Duration::from_secs(120), stalled).await;
            within.expect("the run to be killed took the message it stalls on");
        });
        let inbox = stalling(pool.clone()).await;
        run_until_applied(&inbox, pool, broker.source().await, applied).await
    }

    pub async fn a_run_killed_with_work_in_flight_loses_nothing<B: TestBroker>() {
        let Some(broker) = B::new("conformance_killed").await else {
            return;
        };
        let Some(pool) = ledger("conformance_killed").await else {
            return;
        };
        let event_id = format!("crash-{}", std::any::type_name::<B>());
        broker
            .publish(&envelope(&Credited::new(event_id.clone(), "acct", 1, 5)))
            .await
            .expect("publish");

        // The run is killed while the handler is in flight.
        let report = kill_at_the_stall_then_run_again(&broker, &pool, None, &event_id, 1).await;

        assert_eq!(
            balance(&pool, "acct").await,
            5,
            "the delivery in flight was lost: {report:?}"
        );
        assert_eq!(
            report.handler_calls_with(Outcome::Processed),
            1,
            "{report:?}"
        );
    }

    /// In batched mode the run is killed while a batch's transaction is open: the handlers
    /// before the stalled one have written, nothing is committed or acknowledged. The next run
    /// applies every message of the batch once: none lost, none twice.
    pub async fn a_run_killed_with_a_batch_in_flight_loses_nothing<B: TestBroker>() {
        let Some(broker) = B::new("conformance_killed_batch").await else {
            return;
        };
        let Some(pool) = ledger("conformance_killed_batch").await else {
            return;
        };
        let events: Vec<Credited> = (1..=4)
            .map(|n| {
                let id = format!("crash-batch-{n}-{}", std::any::type_name::<B>());
                Credited::new(id, format!("acct-{n}"), 1, n)
            })
            .collect();
        // Only the third event's first attempt stalls; the others are taken as tried already.
        let stalled = events[2].event_id.clone();
        let others = events.iter().filter(|e| e.event_id != stalled);
        STALLED
            .lock()
            .unwrap()
            .extend(others.map(|e| e.event_id.clone()));
        for event in &events {
            broker.publish(&envelope(event)).await.expect("publish");
        }
        let batch = inbox::Batch::new(4).linger(Duration::from_millis(500));

        let report =
            kill_at_the_stall_then_run_again(&broker, &pool, Some(batch), &stalled, 4).await;

        for event in &events {
            let balance = balance(&pool, &event.account).await;
            assert_eq!(balance, event.amount, "{}: {report:?}", event.account);
        }
        assert_eq!(
            report.handler_calls_with(Outcome::Processed),
            4,
            "{report:?}"
        );
    }

    pub async fn a_broker_restarted_mid_run_loses_nothing<B: TestBroker>() {
        let Some((broker, mut server)) = B::on_own_server("conformance_restart").await else {
            return not_promised::<B>("runs on a server of the suite's own");
        };
        let Some(pool) = ledger("conformance_restart").await else {
            return;
        };
        let (accounts, per_account) = (6, 10);
        let (stream, distinct) = shuffled_stream(accounts, per_account);
        let (before, after) = stream.split_at(stream.len() / 2);
        publish_all(&broker, before).await;
        let inbox = Inbox::builder(pool.clone())
            .consumer("ledger")
            .handler(credit_strict)
            .build()
            .await
            .unwrap();
        let (running, source) = (pool.clone(), broker.source().await);
        let run = tokio::spawn(async move {
            run_until_applied(&inbox, &running, source, distinct as i64).await
        });
        common::eventually_async("some messages applied", || async {
            count(&pool, "applied").await >= 10
        })
        .await;

        server.restart().await;
        for (n, event) in after.iter().enumerate() {
            let envelope = Envelope::encode(format!("after-{n}"), event).expect("encode");
            publish_eventually(&broker, &envelope).await;
        }
        let report = run.await.unwrap();

        assert_eq!(count(&pool, "applied").await, distinct as i64, "{report:?}");
        assert_applied_in_order(&pool, accounts, per_account).await;
    }

    pub async fn a_shutdown_hands_back_what_was_prefetched<B: TestBroker>() {
        let Some(broker) = B::new("conformance_drain").await else {
            return;
        };
        let Some(pool) = ledger("conformance_drain").await else {
            return;
        };
        let stream: Vec<Credited> = (0..40)
            .map(|n| Credited::new(format!("e-{n}"), format!("acct-{n}"), 1, 1))
            .collect();
        publish_all(&broker, &stream).await;
        let inbox = Inbox::builder(pool.clone())
            .handler(credit)
            .build()
            .await
            .unwrap();

        let first = run_until_applied(&inbox, &pool, broker.patient_source().await, 5).await;
        let within = tokio::time::timeout(Duration::from_secs(15), async {
            run_until_applied(&inbox, &pool, broker.patient_source().await, 40).await
        });
        let second = within.await;

        assert_eq!(
            count(&pool, "applied").await,
            40,
            "what the first run fetched and did not handle came back only after the broker's timeout: {first:?} {second:?}"
        );
    }

    /// Publishes `envelope`, trying again while the broker's client reconnects (a broker that
    /// boots a runtime of its own, as RabbitMQ's Erlang node does, may take many seconds on a
    /// loaded machine): up to two minutes, as long as the server's own start may take. A failure
    /// says what the last try met.
    pub async fn publish_eventually<B: TestBroker>(broker: &B, envelope: &Envelope) {
        let started = std::time::Instant::now();
        let mut last = String::new();
        while started.elapsed() < Duration::from_secs(120) {
            match published_within_seconds(broker, envelope).await {
                Ok(()) => return,
                Err(error) => last = error,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the broker took no message for two minutes after its restart; last: {last}");
    }

    /// Whether `broker` took `envelope` within five seconds, or what happened instead: a publish
    /// to a server that is coming back may wait for a confirm that never comes.
    async fn published_within_seconds<B: TestBroker>(
        broker: &B,
        envelope: &Envelope,
    ) -> Result<(), String> {
        let publish = broker.publish(envelope);
        match tokio::time::timeout(Duration::from_secs(5), publish).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("no answer within five seconds".to_owned()),
        }
    }

    /// Credits after sleeping past the broker's redelivery timeout.
    #[inbox_handler(key = "event_id", aggregate = "account", name = "slow_credit")]
    async fn slow_credit(
        tx: &mut sqlx::SqliteConnection,
        msg: Credited,
    ) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        apply_credit(tx, &msg).await
    }

    pub async fn a_long_handler_keeps_its_delivery<B: TestBroker>() {
        if !B::FEATURES.redelivers_on_timeout {
            return not_promised::<B>("takes deliveries back after a timeout");
        }
        let Some(broker) = B::new("conformance_long").await else {
            return;
        };
        let Some(pool) = ledger("conformance_long").await else {
            return;
        };
        publish_one(&broker, 5).await;
        let inbox = Inbox::builder(pool.clone())
            .handler(slow_credit)
            .build()
            .await
            .unwrap();

        let source = broker.source().await;
        let report = run_until_applied(&inbox, &pool, source, 1).await;

        assert_eq!(
            report.handler_calls_with(Outcome::Processed),
            1,
            "{report:?}"
        );
        assert_eq!(
            report.handler_calls_with(Outcome::Duplicate),
            0,
            "redelivered while its handler ran: {report:?}"
        );
        assert_not_delivered_again(&broker, "redelivered after its ack").await;
    }
}

/// The outbox relay through each broker's publisher.
mod relay {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::future::BoxFuture;
    use inbox::outbox::{self, OutboxStatus, Outgoing, Relay};
    use inbox::{RetryPolicy, Sink, SinkError};

    use super::*;

    /// A publisher that stops answering after `publications`: a relay killed between the broker's
    /// confirm and its commit.
    struct Dying<S> {
        sink: S,
        publications: AtomicUsize,
        sent: Arc<AtomicUsize>,
        died: Arc<tokio::sync::Notify>,
    }

    impl<S: Sink> Sink for Dying<S> {
        fn publish<'a>(
            &'a self,
            destination: &'a str,
            envelope: &'a Envelope,
        ) -> BoxFuture<'a, Result<(), SinkError>> {
            Box::pin(async move {
                self.sink.publish(destination, envelope).await?;
                self.sent.fetch_add(1, Ordering::SeqCst);
                if self.publications.fetch_sub(1, Ordering::SeqCst) == 1 {
                    self.died.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok(())
            })
        }
    }

    /// Writes `events` to the outbox, each to `destination`, in one transaction.
    async fn write(pool: &Pool, events: &[Credited], destination: &str) {
        let mut tx = pool.begin().await.expect("begin");
        for event in events {
            let outgoing = Outgoing::encode(event)
                .expect("encode")
                .destination(destination);
            outbox::publish(&mut *tx, outgoing)
                .await
                .expect("write to the outbox");
        }
        tx.commit().await.expect("commit");
    }

    pub async fn a_relay_killed_before_marking_publishes_again_and_the_inbox_drops_the_copies<
        B: TestBroker,
    >() {
        let Some(broker) = B::new("conformance_relay_crash").await else {
            return;
        };
        let pool = ledger("conformance_relay_crash").await.expect("SQLite");
        let events: Vec<_> = (1..=5)
            .map(|n| Credited::new(format!("e-{n}"), format!("acct-{n}"), 1, n))
            .collect();
        write(&pool, &events, &broker.destination()).await;

        let died = Arc::new(tokio::sync::Notify::new());
        let sent = Arc::new(AtomicUsize::new(0));
        let dying = Dying {
            sink: broker.sink().await,
            publications: AtomicUsize::new(3),
            sent: Arc::clone(&sent),
            died: Arc::clone(&died),
        };
        // Long enough for a first publication's confirm (Kafka's idempotent producer first asks
        // the broker for its id), as a relay waits at most half its lease.
        let lease = Duration::from_secs(2);
        let relay = Relay::new(pool.clone(), dying).lease(lease);
        let batch = tokio::spawn(async move { relay.publish_batch().await });
        tokio::time::timeout(Duration::from_secs(30), died.notified())
            .await
            .expect("the relay published three messages");
        batch.abort();
        assert!(batch.await.is_err_and(|e| e.is_cancelled()));
        tokio::time::sleep(lease).await;

        let relay = Relay::new(pool.clone(), broker.sink().await);
        assert_eq!(relay.publish_batch().await.expect("relay").published, 5);
        let inbox = Inbox::builder(pool.clone())
            .handler(credit)
            .build()
            .await
            .expect("build");
        let mut report = run_until_applied(&inbox, &pool, broker.source().await, 5).await;
        // The copies may come after the last message applied: consume a moment longer.
        let linger = tokio::time::sleep(Duration::from_secs(1));
        let rest = inbox
            .run_until(broker.source().await, linger)
            .await
            .expect("run");
        for (outcome, count) in rest.handler_outcomes {
            *report.handler_outcomes.entry(outcome).or_default() += count;
        }
        assert_eq!(
            report.handler_outcomes.get("processed"),
            Some(&5),
            "each message applies once"
        );
        let sent = sent.load(Ordering::SeqCst) as u64;
        assert!(sent >= 3, "the dead relay published before it died");
        let copies = report.handler_outcomes.get("duplicate").copied();
        if B::FEATURES.drops_republished {
            assert_eq!(copies, None, "the broker dropped the copies");
        } else {
            // What the dead relay had sent when it died: at least what was confirmed.
            let copies = copies.unwrap_or(0);
            assert!(
                (sent..=5).contains(&copies),
                "{copies} copies, {sent} confirmed"
            );
        }
        assert_eq!(count(&pool, "applied").await, 5);
    }

    pub async fn a_message_the_broker_refuses_is_kept_with_its_error<B: TestBroker>() {
        let Some(broker) = B::new("conformance_relay_refused").await else {
            return;
        };
        let Some(refused) = broker.refused_destination().await else {
            return suite::not_promised::<B>("refuses a message");
        };
        let pool = ledger("conformance_relay_refused").await.expect("SQLite");
        write(&pool, &[Credited::new("e-1", "acct", 1, 1)], &refused).await;
        let relay = Relay::new(pool.clone(), broker.sink().await)
            .retry(RetryPolicy::new(1))
            .publish_timeout(Duration::from_secs(10));
        assert_eq!(relay.publish_batch().await.expect("relay").failed, 1);
        let failed = outbox::list(&pool, Some(OutboxStatus::Failed), 10)
            .await
            .expect("list");
        assert_eq!(failed.len(), 1, "the refused message is kept, given up on");
        assert!(
            failed[0]
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("refused")),
            "{:?}",
            failed[0].last_error
        );
    }
}

/// The suite's tests for one broker, in a module named after it.
macro_rules! conformance {
    ($module:ident, $broker:ty) => {
        mod $module {
            conformance!(@each $broker, suite:
                consumes_what_was_published_with_payload_and_headers,
                a_nacked_delivery_comes_again,
                an_unsettled_delivery_goes_to_the_next_consumer,
                an_acked_delivery_never_comes_again,
                a_shuffled_duplicated_stream_keeps_the_ledger_exact,
                two_consumers_in_one_group_apply_each_message_once,
                a_delivery_without_a_type_tag_is_kept_as_rejected,
                a_recorded_failure_does_not_hold_up_the_deliveries_behind_it,
                a_run_killed_with_work_in_flight_loses_nothing,
                a_run_killed_with_a_batch_in_flight_loses_nothing,
                a_long_handler_keeps_its_delivery,
                a_broker_restarted_mid_run_loses_nothing,
                a_shutdown_hands_back_what_was_prefetched
            );
            conformance!(@each $broker, relay:
                a_relay_killed_before_marking_publishes_again_and_the_inbox_drops_the_copies,
                a_message_the_broker_refuses_is_kept_with_its_error
            );
        }
    };
    (@each $broker:ty, $suite:ident: $($test:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                crate::$suite::$test::<$broker>().await
            }
        )*
    };
}

conformance!(memory, crate::Memory);
#[cfg(feature = "nats")]
conformance!(jetstream, crate::jetstream_broker::JetStream);
#[cfg(feature = "amqp")]
conformance!(rabbitmq, crate::rabbitmq_broker::RabbitMq);
#[cfg(feature = "redis")]
conformance!(redis_streams, crate::redis_broker::RedisStreams);
#[cfg(feature = "postgres-queue")]
conformance!(postgres_queue, crate::postgres_queue_broker::PostgresQueue);
#[cfg(feature = "kafka")]
conformance!(kafka, crate::kafka_broker::Kafka);
