//! Which consumer group a command acts on: the one `--consumer` names or, without it, every
//! consumer for a list, and for a command on one message or stream the only consumer that has it.

use std::fmt;

use inbox_core::Backend;
use sqlx::Pool;

use crate::error::CliError;

/// Where a command looked: what an empty list or a "not found" error says, naming the
/// consumers there are when the one asked for is not among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Searched {
    /// The consumer `--consumer` named, and those the database holds.
    Consumer {
        /// The consumer named.
        named: String,
        /// The consumers the database holds.
        existing: Vec<String>,
    },
    /// Every consumer the database holds.
    Every(Vec<String>),
}

impl fmt::Display for Searched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Consumer { named, existing } if existing.contains(named) => {
                write!(f, "for consumer `{named}`")
            }
            Self::Consumer { named, existing } => {
                write!(
                    f,
                    "for consumer `{named}` ({})",
                    existing_consumers(existing)
                )
            }
            Self::Every(existing) if existing.is_empty() => {
                f.write_str("for any consumer (this database holds no messages yet)")
            }
            Self::Every(existing) => write!(f, "for any consumer ({})", names(existing)),
        }
    }
}

/// "the consumers in this database are `a`, `b`", or that there are none.
fn existing_consumers(existing: &[String]) -> String {
    match existing {
        [] => "this database holds no messages yet".to_owned(),
        [one] => format!("the only consumer in this database is `{one}`"),
        several => format!("the consumers in this database are {}", names(several)),
    }
}

/// `a`, `b`, `c`.
pub fn names(consumers: &[String]) -> String {
    let quoted: Vec<String> = consumers.iter().map(|name| format!("`{name}`")).collect();
    quoted.join(", ")
}

/// The consumers a list covers (the one named, or every one the database holds), and how to say
/// where it looked.
pub async fn listed<DB: Backend>(
    pool: &Pool<DB>,
    named: Option<String>,
) -> Result<(Vec<String>, Searched), CliError> {
    let existing = inbox_core::storage::operators::consumers(pool).await?;
    Ok(match named {
        Some(named) => (vec![named.clone()], Searched::Consumer { named, existing }),
        None => (existing.clone(), Searched::Every(existing)),
    })
}

/// What `fetch` lists for each consumer a list covers (see [`listed`]), each row with its
/// consumer, in the order of the consumers; and how to say where it looked.
pub async fn gather<DB: Backend, T>(
    pool: &Pool<DB>,
    named: Option<String>,
    fetch: impl AsyncFn(&str) -> Result<Vec<T>, sqlx::Error>,
) -> Result<(Vec<(String, T)>, Searched), CliError> {
    let (consumers, searched) = listed(pool, named).await?;
    let mut rows = Vec::new();
    for consumer in consumers {
        let found = fetch(&consumer).await?;
        rows.extend(found.into_iter().map(|row| (consumer.clone(), row)));
    }
    Ok((rows, searched))
}

/// `found`, if it is of the consumer `named` (or none was named); `consumer` says whose it is.
pub fn theirs<T>(
    found: Option<T>,
    named: Option<&str>,
    consumer: impl Fn(&T) -> &str,
) -> Option<T> {
    found.filter(|found| named.is_none_or(|named| named == consumer(found)))
}

/// Which consumer holds what a command names, as `holds` finds it.
#[derive(Debug)]
pub enum Holder {
    /// This one: the one named, or the only one that holds it.
    One(String),
    /// None of those searched.
    Nobody(Searched),
    /// Several, and none was named.
    Several(Vec<String>),
}

/// The consumer that holds what a command names: the one `named` if it does, else the only
/// consumer of the database that does.
pub async fn holding<DB: Backend>(
    pool: &Pool<DB>,
    named: Option<String>,
    holds: impl AsyncFn(&str) -> Result<bool, CliError>,
) -> Result<Holder, CliError> {
    let (candidates, searched) = listed(pool, named).await?;
    let mut holders = Vec::new();
    for consumer in candidates {
        if holds(&consumer).await? {
            holders.push(consumer);
        }
    }
    Ok(match holders.len() {
        0 => Holder::Nobody(searched),
        1 => Holder::One(holders.remove(0)),
        _ => Holder::Several(holders),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumers(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn a_search_names_the_consumers_there_are_when_the_one_named_is_not_among_them() {
        let named = |existing: &[&str]| Searched::Consumer {
            named: "default".into(),
            existing: consumers(existing),
        };
        assert_eq!(named(&["default"]).to_string(), "for consumer `default`");
        assert_eq!(
            named(&["shop"]).to_string(),
            "for consumer `default` (the only consumer in this database is `shop`)"
        );
        assert_eq!(
            named(&["billing", "shop"]).to_string(),
            "for consumer `default` (the consumers in this database are `billing`, `shop`)"
        );
        assert_eq!(
            Searched::Every(consumers(&["billing", "shop"])).to_string(),
            "for any consumer (`billing`, `shop`)"
        );
        assert!(
            Searched::Every(vec![])
                .to_string()
                .contains("no messages yet")
        );
    }
}
