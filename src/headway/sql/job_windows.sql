-- The window claims of run_once on PostgreSQL and MySQL/MariaDB (lock/backends/windows.py).
-- Named queries: each "-- name:" line starts one, run as one statement; a name starts with
-- its dialect ("postgresql_", "mysql_"). A claim's statements run in one transaction,
-- but for MySQL's insert, which runs in one of its own (windows.py says why).
--
-- The table, headway_job_windows, one row per job (ShedLock's table, plus a fence):
--   name          the job's name (run_once's name; a long one shortened, see windows.py)
--   locked_until  when the window ends: the claim's at_most_for, then at_least_for
--   locked_at     when the window was claimed
--   locked_by     who claimed it: the lease's token, a space, the host's name
--   fence         the claim's fencing token: the row's last + 1, floored by the server's
--                 clock in microseconds + 1, so a lost row still yields a larger one
-- Every time is the DATABASE's clock (PostgreSQL statement_timestamp(), MySQL
-- UTC_TIMESTAMP(6)), never a client's: instances with skewed clocks judge one window.
--
-- Parameters:
--   :name  the row's name            :by     the claimant (locked_by)
--   :most  at_most_for, in seconds   :least  at_least_for, in seconds
-- A claim succeeds only if the row is missing or its locked_until <= now, in one
-- statement; an end sets locked_until = max(locked_at + :least, now) if :by still holds it.

-- name: postgresql_create
CREATE TABLE IF NOT EXISTS headway_job_windows (
    name TEXT NOT NULL PRIMARY KEY,
    locked_until TIMESTAMPTZ NOT NULL,
    locked_at TIMESTAMPTZ NOT NULL,
    locked_by TEXT NOT NULL,
    fence BIGINT NOT NULL
)

-- name: postgresql_claim
-- Returns the claim's fence, or no row (the window is held). ON CONFLICT re-reads the
-- row once a concurrent claim committed, so of two claims one wins.
INSERT INTO headway_job_windows AS w (name, locked_until, locked_at, locked_by, fence)
VALUES (
    :name,
    statement_timestamp() + make_interval(secs => CAST(:most AS double precision)),
    statement_timestamp(),
    :by,
    CAST(extract(epoch FROM statement_timestamp()) * 1000000 AS bigint) + 1
)
ON CONFLICT (name) DO UPDATE
SET locked_until = EXCLUDED.locked_until, locked_at = EXCLUDED.locked_at,
    locked_by = EXCLUDED.locked_by, fence = GREATEST(w.fence + 1, EXCLUDED.fence)
WHERE w.locked_until <= statement_timestamp()
RETURNING w.fence

-- name: postgresql_end
-- One row updated: :by held the window; none: it had run out (or was claimed since).
UPDATE headway_job_windows
SET locked_until = GREATEST(
    locked_at + make_interval(secs => CAST(:least AS double precision)), statement_timestamp()
)
WHERE name = :name AND locked_by = :by AND locked_until > statement_timestamp()

-- name: mysql_create
-- VARBINARY: compared byte for byte (a _bin collation would ignore trailing spaces).
CREATE TABLE IF NOT EXISTS headway_job_windows (
    name VARBINARY(255) NOT NULL PRIMARY KEY,
    locked_until DATETIME(6) NOT NULL,
    locked_at DATETIME(6) NOT NULL,
    locked_by VARCHAR(255) CHARACTER SET ascii NOT NULL,
    fence BIGINT UNSIGNED NOT NULL
) ENGINE = InnoDB

-- name: mysql_claim
-- The row's update (the usual case, once the row exists). Rows matched (the client's
-- found-rows count): 1 claimed, 0 held or missing. The WHERE is judged before any SET.
UPDATE headway_job_windows
SET locked_until = UTC_TIMESTAMP(6) + INTERVAL CAST(:most * 1000000 AS SIGNED) MICROSECOND,
    locked_at = UTC_TIMESTAMP(6),
    locked_by = :by,
    fence = GREATEST(fence + 1, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED) + 1)
WHERE name = :name AND locked_until <= UTC_TIMESTAMP(6)

-- name: mysql_insert
-- The job's first claim, after mysql_claim matched no row: 1 row inserted, or 0 (a row
-- exists: it was held, or another claim inserted it meanwhile and holds it).
INSERT IGNORE INTO headway_job_windows (name, locked_until, locked_at, locked_by, fence)
VALUES (
    :name,
    UTC_TIMESTAMP(6) + INTERVAL CAST(:most * 1000000 AS SIGNED) MICROSECOND,
    UTC_TIMESTAMP(6),
    :by,
    CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED) + 1
)

-- name: mysql_fence
-- The fence of a claim just made in this transaction (its row is locked till the commit).
SELECT fence FROM headway_job_windows WHERE name = :name AND locked_by = :by

-- name: mysql_end
-- Rows matched: 1 if :by held the window, 0 if it had run out (or was claimed since).
UPDATE headway_job_windows
SET locked_until = GREATEST(
    locked_at + INTERVAL CAST(:least * 1000000 AS SIGNED) MICROSECOND, UTC_TIMESTAMP(6)
)
WHERE name = :name AND locked_by = :by AND locked_until > UTC_TIMESTAMP(6)
