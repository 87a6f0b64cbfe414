//! The database handle every storage function works through: a pool per backend, connections
//! and transactions that either backend can stand behind, and the one macro that runs a function
//! body on whichever backend it got.
//!
//! Storage functions live in modules by concern (`accounts`, `alerts`, `jobs`, `tokens`,
//! `usage`, …) and take a [`Conn`]: a pooled connection for one call, or one borrowed from a
//! [`Tx`] so that the application layer can compose one transaction across concerns. Each body
//! is written once; [`on_backend!`] type-checks it once per backend, because sqlx's executor
//! types differ per database while the statements (with `$N` placeholders) do not.

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Pool, Postgres, Sqlite, SqliteConnection};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::StoreError;

/// A database: SQLite (one writer at a time, taken in turn here) or PostgreSQL (any number of
/// writers, from this replica and others). Cloning shares the pool.
#[derive(Clone)]
pub enum Db {
    Sqlite {
        pool: Pool<Sqlite>,
        /// SQLite allows one writer: writers take turns here rather than meet "database is
        /// locked". The store's own writes take the same turn.
        writer: Arc<Mutex<()>>,
    },
    Postgres {
        pool: Pool<Postgres>,
    },
}

impl Db {
    pub fn backend(&self) -> &'static str {
        match self {
            Db::Sqlite { .. } => "sqlite",
            Db::Postgres { .. } => "postgres",
        }
    }

    /// A pooled connection for reads. Each statement commits on its own.
    pub async fn read(&self) -> Result<Conn<'static>, StoreError> {
        Ok(match self {
            Db::Sqlite { pool, .. } => Conn::SqlitePooled(pool.acquire().await?, None),
            Db::Postgres { pool } => Conn::PostgresPooled(pool.acquire().await?),
        })
    }

    /// A pooled connection for writes: on SQLite it holds the writer's turn until dropped.
    /// Each statement commits on its own; a function that writes several opens its own
    /// transaction on it (a savepoint when the connection is already in one).
    pub async fn write(&self) -> Result<Conn<'static>, StoreError> {
        Ok(match self {
            Db::Sqlite { pool, writer } => {
                let turn = writer.clone().lock_owned().await;
                Conn::SqlitePooled(pool.acquire().await?, Some(turn))
            }
            Db::Postgres { pool } => Conn::PostgresPooled(pool.acquire().await?),
        })
    }

    /// A transaction that holds the writer's turn on SQLite: what the application layer opens to
    /// make several storage calls, of one concern or several, one change.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(match self {
            Db::Sqlite { pool, writer } => {
                let turn = writer.clone().lock_owned().await;
                Tx::Sqlite(pool.begin_with(SQLITE_BEGIN_WRITE).await?, turn)
            }
            Db::Postgres { pool } => Tx::Postgres(pool.begin().await?),
        })
    }
}

/// How SQLite begins a transaction that writes: with the write lock taken up front. A deferred
/// transaction that has read cannot wait for the lock (SQLite refuses it at once, "database is
/// locked", to avoid a deadlock), and the lock may still be held a moment after the writer's turn
/// is handed on: a dropped transaction's rollback runs on its connection's own thread. Taken at
/// `BEGIN`, the lock is waited for (`busy_timeout`).
pub const SQLITE_BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// Begins a transaction on a connection that writes (a savepoint when it is already in one); on
/// SQLite the outermost takes the write lock at once (see [`SQLITE_BEGIN_WRITE`]).
pub async fn begin_write<C: sqlx::Connection>(
    c: &mut C,
) -> Result<sqlx::Transaction<'_, C::Database>, sqlx::Error> {
    use sqlx::Database;
    if <C::Database as Database>::NAME == Sqlite::NAME && !c.is_in_transaction() {
        c.begin_with(SQLITE_BEGIN_WRITE).await
    } else {
        c.begin().await
    }
}

/// What a backend does its own way, named where a shared body needs it.
pub trait Dialect {
    /// Set for the roll-up's reads of a group of hosts (each backend's file says why).
    const ROLLUP_READ_SETTINGS: &'static [&'static str];
    /// An owner's value in a dimension bound as a parameter, as SQL over `owners o` (NULL if
    /// none): the SQL before and after the parameter.
    const OWNER_VALUE: (&'static str, &'static str);
    /// [`Dialect::OWNER_VALUE`] around `param` (`$3`).
    fn owner_value(param: &str) -> String {
        let (open, close) = Self::OWNER_VALUE;
        format!("{open}{param}{close}")
    }
    /// The owners' unique key, as SQL around an owner's text (`labels` or a bound text): the
    /// text before and after it.
    const OWNER_KEY: (&'static str, &'static str);
    /// An aggregate of the distinct values of an expression as a JSON array's text: the SQL
    /// before and after the expression.
    const JSON_SET: (&'static str, &'static str);
    /// Each GPU's newest window that starts at most `$1` ms before its host's last report, as a
    /// join onto `gpus g` and `hosts h` that names it `w` (none when there is none).
    const NEWEST_WINDOW: &'static str;
    /// The texts of a JSON array bound as a parameter, as a subquery (`x IN (…)`): the SQL
    /// before and after the parameter.
    const JSON_ARRAY_TEXTS: (&'static str, &'static str);
    /// The same as a table of one column named `value` (`FROM (…) v`, then `v.value`).
    const JSON_ARRAY_VALUES: (&'static str, &'static str);
    /// A sum of a BIGINT column that never fails on overflow (SQLite's SUM raises, PostgreSQL's
    /// cast back to BIGINT does): at most [`COUNT_SUM_CAP`], read as a BIGINT. The SQL before
    /// and after the column.
    const CAPPED_SUM: (&'static str, &'static str);
}

/// The most a sum of counts (requests, tokens) reads as: far above any real count, well inside
/// a 64-bit integer. Counts posted by agents are bounded one by one; their sum is capped here.
pub const COUNT_SUM_CAP: i64 = 9_000_000_000_000_000_000;

/// A connection on either backend, owned (from the pool) or borrowed (from a transaction).
pub enum Conn<'a> {
    SqlitePooled(PoolConnection<Sqlite>, Option<OwnedMutexGuard<()>>),
    Sqlite(&'a mut SqliteConnection),
    PostgresPooled(PoolConnection<Postgres>),
    Postgres(&'a mut PgConnection),
}

/// The connection underneath a [`Conn`], whichever way it is held: what [`on_backend!`]
/// matches on.
pub enum Backend<'c> {
    Sqlite(&'c mut SqliteConnection),
    Postgres(&'c mut PgConnection),
}

impl Conn<'_> {
    pub fn backend(&mut self) -> Backend<'_> {
        match self {
            Conn::SqlitePooled(c, _) => Backend::Sqlite(c),
            Conn::Sqlite(c) => Backend::Sqlite(c),
            Conn::PostgresPooled(c) => Backend::Postgres(c),
            Conn::Postgres(c) => Backend::Postgres(c),
        }
    }
}

/// An open transaction. Dropped without [`Tx::commit`], it rolls back.
pub enum Tx {
    Sqlite(sqlx::Transaction<'static, Sqlite>, OwnedMutexGuard<()>),
    Postgres(sqlx::Transaction<'static, Postgres>),
}

impl Tx {
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::Sqlite(tx, _) => Conn::Sqlite(tx),
            Tx::Postgres(tx) => Conn::Postgres(tx),
        }
    }

    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Sqlite(tx, _turn) => tx.commit().await?,
            Tx::Postgres(tx) => tx.commit().await?,
        }
        Ok(())
    }
}

/// Where a storage function runs: on the database (it takes a connection from the pool, and on
/// SQLite the writer's turn if it writes) or on a connection the caller holds, such as one in an
/// open [`Tx`]. Functions take `impl Into<On>`, so a caller passes `store.db()` or `&mut tx`.
pub enum On<'a> {
    Db(&'a Db),
    Conn(Conn<'a>),
}

impl<'a> On<'a> {
    /// A connection for a function that only reads.
    pub async fn read(self) -> Result<Conn<'a>, StoreError> {
        match self {
            On::Db(db) => db.read().await,
            On::Conn(c) => Ok(c),
        }
    }

    /// A connection for a function that writes.
    pub async fn write(self) -> Result<Conn<'a>, StoreError> {
        match self {
            On::Db(db) => db.write().await,
            On::Conn(c) => Ok(c),
        }
    }
}

impl<'a> From<&'a Db> for On<'a> {
    fn from(db: &'a Db) -> Self {
        On::Db(db)
    }
}

impl<'a> From<&'a mut Tx> for On<'a> {
    fn from(tx: &'a mut Tx) -> Self {
        On::Conn(tx.conn())
    }
}

impl<'a> From<&'a mut SqliteConnection> for On<'a> {
    fn from(c: &'a mut SqliteConnection) -> Self {
        On::Conn(Conn::Sqlite(c))
    }
}

impl<'a> From<&'a mut PgConnection> for On<'a> {
    fn from(c: &'a mut PgConnection) -> Self {
        On::Conn(Conn::Postgres(c))
    }
}

/// Runs `$body` with `$c` bound to the backend's own connection (`&mut SqliteConnection` or
/// `&mut PgConnection`) and, if named, `$db` to its sqlx database type: the body is written once and
/// checked once per backend.
macro_rules! on_backend {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn.backend() {
            $crate::store::db::Backend::Sqlite($c) => $body,
            $crate::store::db::Backend::Postgres($c) => $body,
        }
    };
    ($conn:expr, |$c:ident, $db:ident| $body:expr) => {
        match $conn.backend() {
            $crate::store::db::Backend::Sqlite($c) => {
                #[allow(unused)]
                type $db = sqlx::Sqlite;
                $body
            }
            $crate::store::db::Backend::Postgres($c) => {
                #[allow(unused)]
                type $db = sqlx::Postgres;
                $body
            }
        }
    };
}
pub(crate) use on_backend;
