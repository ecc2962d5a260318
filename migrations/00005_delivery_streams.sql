-- Why this exists: the delivery claim walked pending deliveries in seq order
-- and probed each for "is an earlier one of its stream open?". One stream
-- whose head waits for a retry (or is in flight to a slow endpoint) puts all
-- its later rows in front of every other stream's head, so each claim probed
-- them all: with 20,000 rows behind one failing asset a claim took ~640 ms,
-- and since claims are serial, one bad endpoint slowed delivery to every
-- subscriber (HARD-PARTS 6, "Trap").
--
-- bridge.delivery_streams has one row per (subscription, asset) stream that
-- has ever had a delivery, with ready_at: when the claim should look at it
-- next. The claim reads only streams that are ready now, so its cost follows
-- the batch, not the backlog. The table is a hint, never the authority: the
-- claim still finds each stream's head in bridge.deliveries and checks it
-- under the row lock, so a stale ready_at can cost a wasted probe but never
-- order. What must not happen is a stream with a claimable head and ready_at
-- in the future (it would never be claimed): the claim parks a stream (head
-- waiting for a retry, or no open row) only if gen is still what it read, and
-- the two things that can wake a parked stream — an insert and a revive —
-- bump gen. See claimSQL in internal/webhook/queries.go.

-- +goose Up
-- +goose StatementBegin
CREATE TABLE bridge.delivery_streams (
  subscription_id uuid NOT NULL REFERENCES bridge.subscriptions (id) ON DELETE CASCADE,
  asset_key       text NOT NULL,          -- coalesce(asset_id, ''): the null asset is one stream
  ready_at        timestamptz NOT NULL,   -- 'infinity': nothing to do until something changes
  gen             bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (subscription_id, asset_key)
);
CREATE INDEX delivery_streams_ready ON bridge.delivery_streams (subscription_id, ready_at);

-- New deliveries make their stream ready (at the earliest of what it had and
-- the new row's next_attempt_at). One statement-level trigger per INSERT or
-- COPY, so a consumer batch costs one upsert per stream, not per row. The
-- upsert also locks the stream row until the inserting transaction commits,
-- which is what keeps a concurrent claim's gen check honest.
CREATE FUNCTION bridge.delivery_streams_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT n.subscription_id, coalesce(n.asset_id, ''), min(n.next_attempt_at)
  FROM new_rows n
  WHERE n.status IN ('pending', 'delivering')
  GROUP BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE
    SET ready_at = least(st.ready_at, excluded.ready_at), gen = st.gen + 1;
  RETURN NULL;
END
$fn$;
CREATE TRIGGER deliveries_streams AFTER INSERT ON bridge.deliveries
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION bridge.delivery_streams_on_insert();

-- Streams of deliveries that are open now.
INSERT INTO bridge.delivery_streams (subscription_id, asset_key, ready_at)
SELECT subscription_id, coalesce(asset_id, ''), min(next_attempt_at)
FROM bridge.deliveries
WHERE status IN ('pending', 'delivering')
GROUP BY 1, 2;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TRIGGER deliveries_streams ON bridge.deliveries;
DROP FUNCTION bridge.delivery_streams_on_insert();
DROP TABLE bridge.delivery_streams;
-- +goose StatementEnd
