//! The connection RabbitMQ sources and publishers share, dialled again when it is lost.

use std::sync::Arc;
use std::time::Duration;

use lapin::{Connection, ConnectionProperties};
use tokio::sync::Mutex;

use crate::source::SourceError;

/// How long one dial may take before it counts as failed: a server that takes the TCP connection
/// and says nothing is as away as one that refuses it.
const DIAL_AT_MOST: Duration = Duration::from_secs(10);

/// A connection to RabbitMQ that is dialled again when it is lost, shared (an [`Arc`]) by
/// [`AmqpSource`](super::AmqpSource)s and [`AmqpPublisher`](super::AmqpPublisher)s.
///
/// When the server goes away (a restart, a crash, a cut network), lapin's connection fails, and
/// its channels with it. The next call that needs the connection (a source asked for a delivery,
/// a publisher publishing) dials the server again, once for everyone sharing it. While the server
/// is away, each such call fails (at once where the server refuses the connection, within 10 s
/// where nothing answers), and the run or the relay asks again after a growing delay. Once it is
/// back, the source consumes again on a new channel and the publisher publishes on one; what was
/// unacknowledged on the lost connection, the broker delivers again (the inbox drops the copies
/// of what it had committed).
///
/// lapin's own recovery (`ConnectionProperties::enable_auto_recover`) is left off, and should stay
/// off in the properties given to [`connect_with`](Self::connect_with): when the socket is reset
/// before the server's `connection.close` is read, its I/O loop can wait for ever, with every
/// channel "reconnecting" and every consumer silent.
///
/// ```no_run
/// # async fn demo() -> Result<(), inbox::SourceError> {
/// use inbox::amqp::{AmqpConnection, AmqpPublisher, AmqpSource};
///
/// let connection = AmqpConnection::connect("amqp://127.0.0.1:5672/%2f").await?;
/// let source = AmqpSource::builder(&connection, "billing").build().await?;
/// let publisher = AmqpPublisher::new(connection.clone(), "").await?;
/// # Ok(()) }
/// ```
pub struct AmqpConnection {
    uri: String,
    properties: ConnectionProperties,
    current: Mutex<Arc<Connection>>,
}

impl AmqpConnection {
    /// Connects to the server at `uri` (`amqp://user:password@host:port/vhost`) with lapin's
    /// default properties; fails if the server cannot be reached now.
    pub async fn connect(uri: &str) -> Result<Arc<Self>, SourceError> {
        Self::connect_with(uri, ConnectionProperties::default()).await
    }

    /// Connects with `properties` (a connection name, client properties, a locale), which each
    /// new dial uses too.
    pub async fn connect_with(
        uri: &str,
        properties: ConnectionProperties,
    ) -> Result<Arc<Self>, SourceError> {
        let connection = dial(uri, &properties).await?;
        Ok(Arc::new(Self {
            uri: uri.to_owned(),
            properties,
            current: Mutex::new(Arc::new(connection)),
        }))
    }

    /// The connection as it is now, for channels of the application's own (to declare its
    /// topology, say): the one held while it is up, else a new one dialled first. Fails while the
    /// server cannot be reached.
    pub async fn current(&self) -> Result<Arc<Connection>, SourceError> {
        let mut current = self.current.lock().await;
        if is_lost(&current) {
            tracing::info!("the RabbitMQ connection is lost; dialling the server again");
            *current = Arc::new(dial(&self.uri, &self.properties).await?);
        }
        Ok(Arc::clone(&current))
    }
}

/// Whether `connection` is over for good: failed, or closed.
fn is_lost(connection: &Connection) -> bool {
    let status = connection.status();
    status.errored() || status.closed()
}

/// A new connection to `uri`, or why there is none within [`DIAL_AT_MOST`].
async fn dial(uri: &str, properties: &ConnectionProperties) -> Result<Connection, SourceError> {
    let dialled = tokio::time::timeout(DIAL_AT_MOST, Connection::connect(uri, properties.clone()));
    match dialled.await {
        Ok(connection) => Ok(connection?),
        Err(_) => Err(format!(
            "RabbitMQ did not answer within {} s",
            DIAL_AT_MOST.as_secs()
        )
        .into()),
    }
}
