//! How a statement runs on any database: its parameters as [`Param`]s, its rows read column by
//! column. The sqlx bounds that generic SQL needs are stated here once, on three small traits
//! with blanket impls, and reach every caller through [`Backend`](super::Backend)'s associated
//! type bounds, so the rest of the storage is written once for every database.

use sqlx::error::BoxDynError;
use sqlx::{Arguments, ColumnIndex, Connection, Decode, Encode, Executor, Row, Transaction, Type};

use super::Backend;

/// A value bound to a statement's next placeholder. Each statement takes its parameters once, in
/// order, so the same list fits `$n` (PostgreSQL, SQLite) and `?` (MySQL).
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    /// Text.
    Text(&'a str),
    /// Text or NULL.
    MaybeText(Option<&'a str>),
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit integer or NULL.
    MaybeInt(Option<i64>),
    /// Bytes.
    Bytes(&'a [u8]),
    /// A float.
    Real(f64),
    /// A boolean.
    Flag(bool),
}

/// Arguments that take every kind of [`Param`].
pub trait Bind: Arguments {
    /// Binds `param` to the next placeholder.
    fn push(&mut self, param: Param<'_>) -> Result<(), BoxDynError>;
}

impl<A: Arguments> Bind for A
where
    for<'q> &'q str: Encode<'q, A::Database> + Type<A::Database>,
    for<'q> Option<&'q str>: Encode<'q, A::Database> + Type<A::Database>,
    for<'q> &'q [u8]: Encode<'q, A::Database> + Type<A::Database>,
    for<'q> Option<i64>: Encode<'q, A::Database> + Type<A::Database>,
    for<'q> i64: Encode<'q, A::Database> + Type<A::Database>,
    for<'q> f64: Encode<'q, A::Database> + Type<A::Database>,
    for<'q> bool: Encode<'q, A::Database> + Type<A::Database>,
{
    fn push(&mut self, param: Param<'_>) -> Result<(), BoxDynError> {
        match param {
            Param::Text(text) => self.add(text),
            Param::MaybeText(text) => self.add(text),
            Param::Int(int) => self.add(int),
            Param::MaybeInt(int) => self.add(int),
            Param::Bytes(bytes) => self.add(bytes),
            Param::Real(real) => self.add(real),
            Param::Flag(flag) => self.add(flag),
        }
    }
}

/// A connection that runs statements.
pub trait Run: Connection {
    /// The connection as an executor.
    fn run(&mut self) -> impl Executor<'_, Database = Self::Database>;
}

impl<C: Connection> Run for C
where
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    fn run(&mut self) -> impl Executor<'_, Database = Self::Database> {
        self
    }
}

/// A row whose columns read as the types the inbox stores.
pub trait Columns: Row {
    /// A text column.
    fn text(&self, index: usize) -> Result<String, sqlx::Error>;
    /// A nullable text column.
    fn maybe_text(&self, index: usize) -> Result<Option<String>, sqlx::Error>;
    /// A 64-bit integer column.
    fn int(&self, index: usize) -> Result<i64, sqlx::Error>;
    /// A 32-bit integer column.
    fn int32(&self, index: usize) -> Result<i32, sqlx::Error>;
    /// A nullable 64-bit integer column.
    fn maybe_int(&self, index: usize) -> Result<Option<i64>, sqlx::Error>;
    /// A nullable bytes column.
    fn maybe_bytes(&self, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
    /// A nullable float column.
    fn maybe_real(&self, index: usize) -> Result<Option<f64>, sqlx::Error>;
}

impl<R: Row> Columns for R
where
    usize: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<f64>: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, index: usize) -> Result<String, sqlx::Error> {
        self.try_get(index)
    }
    fn maybe_text(&self, index: usize) -> Result<Option<String>, sqlx::Error> {
        self.try_get(index)
    }
    fn int(&self, index: usize) -> Result<i64, sqlx::Error> {
        self.try_get(index)
    }
    fn int32(&self, index: usize) -> Result<i32, sqlx::Error> {
        self.try_get(index)
    }
    fn maybe_int(&self, index: usize) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(index)
    }
    fn maybe_bytes(&self, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
        self.try_get(index)
    }
    fn maybe_real(&self, index: usize) -> Result<Option<f64>, sqlx::Error> {
        self.try_get(index)
    }
}

/// A value read from one row of a statement's result.
pub trait FromColumns: Sized {
    /// Reads the value from `row`, whose columns come in the order of the statement's `SELECT`.
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error>;
}

impl FromColumns for i64 {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        row.int(0)
    }
}

impl FromColumns for i32 {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        row.int32(0)
    }
}

impl FromColumns for String {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        row.text(0)
    }
}

impl FromColumns for Option<i64> {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        row.maybe_int(0)
    }
}

impl FromColumns for Option<String> {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        row.maybe_text(0)
    }
}

impl FromColumns for (String, i64) {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok((row.text(0)?, row.int(1)?))
    }
}

impl FromColumns for (String, String) {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok((row.text(0)?, row.text(1)?))
    }
}

impl FromColumns for (Option<i64>, i64) {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok((row.maybe_int(0)?, row.int(1)?))
    }
}

impl FromColumns for (String, String, i64) {
    fn from_columns(row: &impl Columns) -> Result<Self, sqlx::Error> {
        Ok((row.text(0)?, row.text(1)?, row.int(2)?))
    }
}

/// A text column that holds one of a set of names, such as a status.
pub(crate) fn named<T>(
    row: &impl Columns,
    index: usize,
    parse: fn(&str) -> Option<T>,
) -> Result<T, sqlx::Error> {
    let value = row.text(index)?;
    parse(&value).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: index.to_string(),
        source: format!("`{value}` is not a value this column holds").into(),
    })
}

fn query<DB: Backend>(
    sql: &'static str,
    params: &[Param<'_>],
) -> Result<sqlx::query::Query<'static, DB, DB::Arguments>, sqlx::Error> {
    let mut arguments = DB::Arguments::default();
    for param in params {
        arguments.push(*param).map_err(sqlx::Error::Encode)?;
    }
    Ok(sqlx::query_with(sql, arguments))
}

/// Runs a statement on `conn`; returns how many rows it wrote (or matched).
pub(crate) async fn execute<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &'static str,
    params: &[Param<'_>],
) -> Result<u64, sqlx::Error> {
    let result = query::<DB>(sql, params)?.execute(conn.run()).await?;
    Ok(DB::rows_affected(&result))
}

/// Runs `sql`, one statement or several, without parameters, as one simple query on `conn`
/// (one round trip): a statement that fails ends it, the ones after it not run.
pub(crate) async fn execute_raw<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &'static str,
) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sql).execute(conn.run()).await.map(drop)
}

/// The first row of a statement's result on `conn`, if any.
pub(crate) async fn fetch_optional<DB: Backend, T: FromColumns>(
    conn: &mut DB::Connection,
    sql: &'static str,
    params: &[Param<'_>],
) -> Result<Option<T>, sqlx::Error> {
    let row = query::<DB>(sql, params)?.fetch_optional(conn.run()).await?;
    row.as_ref().map(T::from_columns).transpose()
}

/// The one row of a statement's result on `conn`.
pub(crate) async fn fetch_one<DB: Backend, T: FromColumns>(
    conn: &mut DB::Connection,
    sql: &'static str,
    params: &[Param<'_>],
) -> Result<T, sqlx::Error> {
    fetch_optional::<DB, T>(conn, sql, params)
        .await?
        .ok_or(sqlx::Error::RowNotFound)
}

/// Every row of a statement's result on `conn`.
pub(crate) async fn fetch_all<DB: Backend, T: FromColumns>(
    conn: &mut DB::Connection,
    sql: &'static str,
    params: &[Param<'_>],
) -> Result<Vec<T>, sqlx::Error> {
    let rows = query::<DB>(sql, params)?.fetch_all(conn.run()).await?;
    rows.iter().map(T::from_columns).collect()
}

/// The connection of an open transaction.
pub(crate) fn conn<'t, DB: Backend>(tx: &'t mut Transaction<'_, DB>) -> &'t mut DB::Connection {
    tx
}
