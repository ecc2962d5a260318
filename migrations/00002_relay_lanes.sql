-- Why this exists: with several relay replicas, SKIP LOCKED alone breaks
-- per-asset order: replica A claims asset X's rows 5 and 6, replica B skips the
-- locked ones, claims X's row 7 and produces it first. Assets are therefore
-- hashed onto a fixed set of lanes (bridge.lane_of) and each lane is leased to
-- one replica at a time. A replica claims only rows of lanes it holds, and every
-- statement that marks rows checks that it still holds the lease (fencing): a
-- replica that stalled past its lease may still finish produce requests that
-- were in flight — harmless duplicates with the same dedup-id — but it can no
-- longer mark rows that now belong to someone else.

-- +goose Up
-- +goose StatementBegin
CREATE TABLE bridge.relay_lanes (
  lane        int PRIMARY KEY,
  owner       text,                   -- relay replica id; NULL when free
  epoch       bigint NOT NULL DEFAULT 0, -- bumped on every change of owner
  expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO bridge.relay_lanes (lane)
SELECT g FROM generate_series(0, bridge.lane_count() - 1) g;

-- Live replicas, so each can compute its fair share of lanes and take over
-- only what must move when one joins or leaves.
CREATE TABLE bridge.relay_members (
  member_id    text PRIMARY KEY,
  hostname     text NOT NULL DEFAULT '',
  started_at   timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL
);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TABLE bridge.relay_members;
DROP TABLE bridge.relay_lanes;
-- +goose StatementEnd
