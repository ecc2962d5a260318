-- Why this exists: the lane lease (00002) was checked in four places, written
-- four ways — once in the claim and pasted into the three statements that mark
-- rows — and one copy drifting from the others would let a replica that lost a
-- lane keep claiming or marking its rows. bridge.relay_fence is that check,
-- written once.
--
-- It returns the lanes `member` holds with at least `margin` of its lease
-- left. The claim asks for a margin (a replica whose renewals stalled stops
-- claiming a lane before its lease can lapse and another replica produce the
-- same asset alongside it); the marks ask for none (a mark after the lease
-- lapsed could overwrite the outcome the lane's new owner writes). STABLE: it
-- reads relay_lanes in the statement's snapshot, so callers evaluate it once
-- per statement (as an InitPlan), not once per row.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION bridge.relay_fence(member text, margin interval DEFAULT '0') RETURNS int[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT coalesce(array_agg(lane ORDER BY lane), '{}')
  FROM bridge.relay_lanes
  WHERE owner = member AND expires_at > now() + margin
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP FUNCTION bridge.relay_fence(text, interval);
-- +goose StatementEnd
