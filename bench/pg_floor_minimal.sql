-- The minimal floor of a fresh key on PostgreSQL (bench/gateway.sh, run by
-- pgbench beside the gateway): the two statements any fenced PENDING/DONE
-- record needs, each its own commit, on a table of the same shape without
-- the store's extras (no timeline, no expiry index). Fixed on purpose: the
-- store's own statements are the other floor (`pgbench_script` example).
\set id :client_id * 1000000000000 + random(1, 999999999999)
INSERT INTO bench_floor_minimal.records AS r (id, fence, state, expires_at) VALUES (:id, 1, 'P', now() + interval '30 seconds') ON CONFLICT (id) DO UPDATE SET fence = r.fence + 1, state = 'P', expires_at = EXCLUDED.expires_at WHERE r.expires_at <= now() RETURNING fence \gset claim_
UPDATE bench_floor_minimal.records SET state = 'D', payload = :payload, expires_at = now() + interval '1 day' WHERE id = :id AND fence = :claim_fence;
