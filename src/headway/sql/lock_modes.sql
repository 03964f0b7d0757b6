-- The PostgreSQL lock backend's read-write locks and semaphores (lock/backends/postgres_modes.py).
-- Named queries: each "-- name:" line starts one, run as one statement (one round trip).
-- Materialised CTEs run in order, each reading the one before: the settings are in force
-- before a lock call, and a fence is taken only after its lock is granted.
-- Common parameters:
--   :ttl     the lease TTL as a setting ('250ms'): idle_in_transaction_session_timeout
--   :wait    how long to wait in the lock manager as a setting ('1000ms'): lock_timeout
--   :app     the session's application_name for the transaction, 'headway:<owner>', or
--            NULL to keep its own (lock/backends/postgres_inspect.py)
-- Keys: :key a 64-bit key (read-write lock, semaphore gate); :cls the semaphore's
-- 31-bit class, its slots are the two-int advisory locks (:cls, 0..n-1); :ttl_cls the
-- class of the locks (:ttl_cls, ttl_ms) by which a permit holder shows its TTL.

-- name: read_wait
-- A reader: waits for the shared lock on :key; returns the fence (txid) once granted.
WITH settings AS MATERIALIZED (
    SELECT set_config('lock_timeout', :wait, true),
           set_config('idle_in_transaction_session_timeout', :ttl, true),
           set_config('application_name', COALESCE(CAST(:app AS text), current_setting('application_name')), true)
), granted AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(:key) FROM settings)
SELECT txid_current() FROM granted

-- name: read_try
-- A reader's single attempt: the fence, or NULL (a holder or a waiter conflicts).
WITH settings AS MATERIALIZED (
    SELECT set_config('idle_in_transaction_session_timeout', :ttl, true),
           set_config('application_name', COALESCE(CAST(:app AS text), current_setting('application_name')), true)
), attempt AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock_shared(:key) AS granted FROM settings
)
SELECT CASE WHEN granted THEN txid_current() END FROM attempt

-- name: permit_enter
-- A permit request: takes the gate (:wait > '0': waits for it, else one try), then a free
-- slot if the holders of every slot number fewer than :n. Returns (fence, gate):
-- fence NULL if no slot was taken; gate true if this session holds the gate now (kept
-- only when :lead and no slot was taken: the caller is the head of the line).
WITH settings AS MATERIALIZED (
    SELECT set_config('lock_timeout', :wait, true),
           set_config('idle_in_transaction_session_timeout', :ttl, true),
           set_config('application_name', COALESCE(CAST(:app AS text), current_setting('application_name')), true)
), gate AS MATERIALIZED (
    SELECT CASE WHEN CAST(:wait AS text) = '0' THEN pg_try_advisory_lock(CAST(:key AS bigint))
                ELSE pg_advisory_lock(CAST(:key AS bigint))::text = '' END AS held
    FROM settings
), room AS MATERIALIZED (
    SELECT gate.held AND (
        SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND objsubid = 2 AND granted
          AND classid = CAST(CAST(:cls AS integer) AS oid)
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ) < CAST(:n AS integer) AS ok
    FROM gate
), slot AS MATERIALIZED (
    -- generate_series in the select list streams: at most (holders + 1) slots are tried.
    SELECT (SELECT i FROM (SELECT generate_series(0, CAST(:n AS integer) - 1) AS i) AS numbers
            WHERE pg_try_advisory_xact_lock(CAST(:cls AS integer), i) LIMIT 1) AS i
    FROM room WHERE room.ok
), done AS MATERIALIZED (
    SELECT txid_current() AS fence, pg_advisory_xact_lock_shared(CAST(:ttl_cls AS integer), CAST(:ttl_ms AS integer))::text AS shown
    FROM slot WHERE slot.i IS NOT NULL
)
SELECT (SELECT fence FROM done),
       CASE WHEN gate.held AND (EXISTS (SELECT FROM done) OR NOT CAST(:lead AS boolean))
            THEN NOT pg_advisory_unlock(CAST(:key AS bigint)) ELSE gate.held END
FROM gate

-- name: permit_retry
-- The head of the line (it holds the gate) tries again for a slot. :idle bounds how long
-- the session may then idle outside a transaction (idle_session_timeout), so a frozen
-- head gives the gate up by its own deadline. Returns (fence, ms): the fence and
-- NULL once a slot is taken (the gate is then given up); else NULL and the ms until the
-- soonest lease of a holder may run out (its session idles out), NULL if none shows.
WITH settings AS MATERIALIZED (
    SELECT set_config('idle_in_transaction_session_timeout', :ttl, true),
           set_config('idle_session_timeout', :idle, false),
           set_config('application_name', COALESCE(CAST(:app AS text), current_setting('application_name')), true)
), room AS MATERIALIZED (
    SELECT count(*) < CAST(:n AS integer) AS ok FROM settings, pg_locks
    WHERE locktype = 'advisory' AND objsubid = 2 AND granted
      AND classid = CAST(CAST(:cls AS integer) AS oid)
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), slot AS MATERIALIZED (
    SELECT (SELECT i FROM (SELECT generate_series(0, CAST(:n AS integer) - 1) AS i) AS numbers
            WHERE pg_try_advisory_xact_lock(CAST(:cls AS integer), i) LIMIT 1) AS i
    FROM room WHERE room.ok
), done AS MATERIALIZED (
    SELECT txid_current() AS fence, pg_advisory_xact_lock_shared(CAST(:ttl_cls AS integer), CAST(:ttl_ms AS integer))::text AS shown
    FROM slot WHERE slot.i IS NOT NULL
), soonest AS MATERIALIZED (
    -- A holder idle in its transaction runs out its TTL after its last statement; one
    -- running a statement, no sooner than a TTL from now.
    SELECT min(CASE WHEN a.state = 'idle in transaction' THEN a.state_change
                    ELSE clock_timestamp() END
               + shown.ttl_ms * interval '1 millisecond') AS at
    FROM pg_locks AS s
    JOIN pg_stat_activity AS a ON a.pid = s.pid
    JOIN LATERAL (
        SELECT max(t.objid::bigint) AS ttl_ms FROM pg_locks AS t
        WHERE t.pid = s.pid AND t.locktype = 'advisory' AND t.objsubid = 2
          AND t.classid = CAST(CAST(:ttl_cls AS integer) AS oid)
    ) AS shown ON shown.ttl_ms IS NOT NULL
    WHERE NOT EXISTS (SELECT FROM done)
      AND s.locktype = 'advisory' AND s.objsubid = 2 AND s.granted
      AND s.classid = CAST(CAST(:cls AS integer) AS oid)
      AND s.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT (SELECT fence FROM done),
       CASE WHEN EXISTS (SELECT FROM done) THEN NOT pg_advisory_unlock(CAST(:key AS bigint)) END,
       (SELECT ceil(extract(epoch FROM at - clock_timestamp()) * 1000)::bigint FROM soonest)

-- name: permit_touch
-- Renews a permit holder's TTL (any statement restarts the idle timer) and shows it.
SELECT set_config('idle_in_transaction_session_timeout', :ttl, true),
       pg_advisory_xact_lock_shared(CAST(:ttl_cls AS integer), CAST(:ttl_ms AS integer))::text

-- name: permit_release
-- Before the commit that frees the slot: wake the head of the line (NOTIFY is sent at
-- commit, after the slot is free), and end a head's idle bound for the pooled session.
SELECT pg_notify(:channel, ''), set_config('idle_session_timeout', '0', false)

-- name: waiting
-- How many requests wait in line for :key (a read-write lock or a semaphore's gate);
-- a semaphore counts the head of its line, which holds the gate (:gate_counts).
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND (NOT granted OR CAST(:gate_counts AS boolean))
  AND classid = CAST((CAST(:key AS bigint) >> 32) & 4294967295 AS oid)
  AND objid = CAST(CAST(:key AS bigint) & 4294967295 AS oid)
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())

-- name: holders
-- The granted holders of a key (the exclusive lock's or a read-write lock's; a semaphore's
-- slots: every number of the class), read from
-- pg_locks alone (every role may read it): whether each holds the key exclusively, its
-- fence (its transaction's id with the epoch, as txid_current() gave it: from the lock
-- each transaction holds on its own id; NULL in the instant between the grant and
-- txid_current()) and its session's application_name (NULL where pg_stat_activity
-- hides another role's sessions).
WITH now AS (SELECT txid_snapshot_xmax(txid_current_snapshot()) AS xmax)
SELECT h.mode = 'ExclusiveLock',
       -- The epoch is the snapshot's, unless the 32-bit id is more than half the id
       -- space away from the snapshot's xmax (it wrapped around between them).
       (now.xmax >> 32) * 4294967296 + x.xid
           - CASE WHEN x.xid - (now.xmax & 4294967295) > 2147483648 THEN 4294967296
                  WHEN x.xid - (now.xmax & 4294967295) < -2147483648 THEN -4294967296
                  ELSE 0 END,
       a.application_name
FROM now, pg_locks AS h
LEFT JOIN LATERAL (
    SELECT min(t.transactionid::text::bigint) AS xid FROM pg_locks AS t
    WHERE t.pid = h.pid AND t.locktype = 'transactionid' AND t.mode = 'ExclusiveLock'
) AS x ON true
LEFT JOIN pg_stat_activity AS a ON a.pid = h.pid
WHERE h.locktype = 'advisory' AND h.objsubid = CAST(:subid AS integer) AND h.granted
  AND h.classid = CAST(CAST(:classid AS bigint) AS oid)
  AND (CAST(:subid AS integer) = 2 OR h.objid = CAST(CAST(:objid AS bigint) AS oid))
  AND h.database = (SELECT oid FROM pg_database WHERE datname = current_database())
