-- Why this exists: the delivery half of the bridge. Every rule here is a failure
-- mode from the webhook design (seeds/000): deliveries carry a seq taken at
-- insert so one (subscription, asset) stream keeps Kafka's partition order; a
-- claim hands out only the head of a stream; the consumer inbox makes a
-- redelivered Kafka record add nothing; the attempt log never holds payloads.

-- +goose Up
-- +goose StatementBegin
CREATE TABLE bridge.subscriptions (
  id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  url                  text NOT NULL,
  description          text NOT NULL DEFAULT '',
  -- Exact event types and 'prefix.*' wildcards; '*' matches everything.
  event_types          text[] NOT NULL,
  topic                text,            -- optional: only events from this topic
  enabled              boolean NOT NULL DEFAULT true,
  disabled_reason      text,
  disabled_at          timestamptz,
  -- Moves only when a delivery dies (one payload the endpoint chokes on cannot
  -- disable a healthy endpoint); any success resets it: "consecutive" is the
  -- whole meaning of the column.
  consecutive_failures int NOT NULL DEFAULT 0,
  created_at           timestamptz NOT NULL DEFAULT now(),
  updated_at           timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT subscriptions_event_types_not_empty CHECK (cardinality(event_types) > 0)
);

-- Signing secrets. Rotation adds a new secret and gives the previous one an
-- expiry (WEBHOOK_SECRET_GRACE): until then both sign every request, so a
-- receiver can switch secrets without rejecting a single delivery.
CREATE TABLE bridge.subscription_secrets (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  subscription_id uuid NOT NULL REFERENCES bridge.subscriptions (id) ON DELETE CASCADE,
  secret          text NOT NULL,         -- 'whsec_' + base64(>= 24 random bytes)
  created_at      timestamptz NOT NULL DEFAULT now(),
  expires_at      timestamptz            -- NULL: current secret
);
CREATE INDEX subscription_secrets_by_subscription ON bridge.subscription_secrets (subscription_id);

-- Consumer inbox: one row per Kafka record turned into deliveries, written in
-- the same transaction as those deliveries. A record seen again (redelivery
-- after a crash before the offset commit, or a duplicate produce) conflicts
-- here and adds nothing.
CREATE TABLE bridge.consumer_inbox (
  dedup_id        text PRIMARY KEY,      -- dedup-id header, or topic/partition/offset
  topic           text NOT NULL,
  kafka_partition int NOT NULL,
  kafka_offset    bigint NOT NULL,
  received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consumer_inbox_received_at ON bridge.consumer_inbox (received_at);

CREATE TABLE bridge.deliveries (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  -- Taken at insert, in Kafka partition order: the order of a
  -- (subscription, asset) stream.
  seq              bigserial UNIQUE,
  subscription_id  uuid NOT NULL REFERENCES bridge.subscriptions (id) ON DELETE CASCADE,
  event_id         text NOT NULL,        -- the dedup id: webhook-id on every attempt
  event_type       text NOT NULL,
  topic            text NOT NULL,
  asset_id         text,                 -- NULL: the null-asset stream
  asset_seq        bigint,
  payload          jsonb NOT NULL,
  event_created_at timestamptz NOT NULL,
  traceparent      text,
  tracestate       text,
  status           text NOT NULL DEFAULT 'pending',
  attempts         int NOT NULL DEFAULT 0,
  next_attempt_at  timestamptz NOT NULL DEFAULT now(),
  lease_expires_at timestamptz,
  claimed_by       text,
  last_error       text,
  last_status_code int,
  created_at       timestamptz NOT NULL DEFAULT now(),
  delivered_at     timestamptz,
  dead_at          timestamptz,
  revived_at       timestamptz,
  CONSTRAINT deliveries_status_valid CHECK (status IN ('pending', 'delivering', 'delivered', 'dead')),
  CONSTRAINT deliveries_once_per_subscription UNIQUE (subscription_id, event_id)
);
-- Stream heads: "is there an earlier undelivered delivery of this
-- (subscription, asset)?" is one probe on this index, so the claim's cost stays
-- proportional to the batch and not to the backlog.
CREATE INDEX deliveries_open_by_stream ON bridge.deliveries (subscription_id, (coalesce(asset_id, '')), seq)
  WHERE status IN ('pending', 'delivering');
CREATE INDEX deliveries_pending_due ON bridge.deliveries (subscription_id, seq) WHERE status = 'pending';
CREATE INDEX deliveries_delivering_lease ON bridge.deliveries (lease_expires_at) WHERE status = 'delivering';
CREATE INDEX deliveries_by_subscription_status ON bridge.deliveries (subscription_id, status, id);

-- One row per HTTP attempt. Never the payload: the log is the most-run query
-- and the cheapest way to read a tenant's whole history if it held one.
CREATE TABLE bridge.delivery_attempts (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  delivery_id   bigint NOT NULL REFERENCES bridge.deliveries (id) ON DELETE CASCADE,
  attempt       int NOT NULL,
  started_at    timestamptz NOT NULL,
  duration_ms   double precision NOT NULL,
  status_code   int,                     -- NULL when no response arrived
  error         text,
  response_body text,                    -- first 1 KiB
  trace_id      text
);
CREATE INDEX delivery_attempts_by_delivery ON bridge.delivery_attempts (delivery_id, attempt);

-- Wake the delivery workers when the consumer commits new deliveries.
CREATE FUNCTION bridge.notify_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('bridge_deliveries', '');
  RETURN NULL;
END
$fn$;
CREATE TRIGGER deliveries_notify AFTER INSERT ON bridge.deliveries
FOR EACH STATEMENT EXECUTE FUNCTION bridge.notify_deliveries();
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TABLE bridge.delivery_attempts;
DROP TABLE bridge.deliveries;
DROP TABLE bridge.consumer_inbox;
DROP TABLE bridge.subscription_secrets;
DROP TABLE bridge.subscriptions;
DROP FUNCTION bridge.notify_deliveries();
-- +goose StatementEnd
