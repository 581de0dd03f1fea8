// An `aggregate` field whose type has no stable text form.
use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
struct LinesAdded {
    event_id: Uuid,
    lines: Vec<String>,
    sequence: i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "lines")]
async fn add_lines(_tx: &mut sqlx::PgConnection, _msg: LinesAdded) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
