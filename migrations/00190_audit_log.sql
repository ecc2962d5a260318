-- Why this exists: who replayed, revived, rotated, disabled or deleted what,
-- from where, and how many rows it changed. Every state-changing action of
-- the console (/ui/) and of the admin API (/api/v1/) writes one row here
-- (internal/audit); `bridge audit list` and the console's Audit page read
-- them newest first.
--
-- Never a payload, a header value or a secret: only what the operator asked
-- for (the action and its scope, e.g. "topic=orders" or "3 ids") and how
-- many rows it changed.
--
-- actor:  the admin token's id (token:<first 8 hex of its SHA-256>), never
--         the token.
-- via:    console or api.
-- remote: the request's peer address (and X-Forwarded-For when a proxy set
--         it: shown, not trusted).
-- target: the subscription, delivery or row the action names ('' for a
--         filter-wide action).

-- +goose Up
CREATE TABLE bridge.audit_log (
  id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at      timestamptz NOT NULL DEFAULT now(),
  actor   text NOT NULL,
  via     text NOT NULL,
  remote  text NOT NULL,
  action  text NOT NULL,
  target  text NOT NULL DEFAULT '',
  scope   text NOT NULL DEFAULT '',
  row_count bigint NOT NULL,
  CONSTRAINT audit_log_via_valid CHECK (via IN ('console', 'api')),
  CONSTRAINT audit_log_action_not_empty CHECK (action <> ''),
  CONSTRAINT audit_log_rows_not_negative CHECK (row_count >= 0)
);

-- +goose Down
DROP TABLE bridge.audit_log;
