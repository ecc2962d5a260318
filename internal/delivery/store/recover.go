package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Recover: revive every dead delivery of one subscription created in a time
// window ("the endpoint was broken from 02:10 to 04:40"), over
// bridge.deliveries and bridge.delivery_streams.

// recoverWindowSQL is reviveSubscriptionSQL narrowed to deliveries created
// in [$2, $3) ($3 NULL: up to now). Revive semantics: attempts reset, seq
// kept, so the revived rows of an asset go out in their original asset_seq
// order, before anything still pending behind them in their stream; the
// streams wake (gen bumped) so a claim in progress cannot miss them. The ids
// come back oldest first (seq is the order deliveries were created in).
const recoverWindowSQL = `
WITH d AS (
  UPDATE bridge.deliveries
  SET status = 'pending', attempts = 0, next_attempt_at = now(), revived_at = now(), last_error = NULL
  WHERE subscription_id = $1 AND status = 'dead' AND created_at >= $2
    AND ($3::timestamptz IS NULL OR created_at < $3::timestamptz)
  RETURNING id, seq, subscription_id, coalesce(asset_id, '') AS asset_key
),
st AS (
  INSERT INTO bridge.delivery_streams AS st (subscription_id, asset_key, ready_at)
  SELECT DISTINCT subscription_id, asset_key, now() FROM d ORDER BY 1, 2
  ON CONFLICT (subscription_id, asset_key) DO UPDATE SET ready_at = now(), gen = st.gen + 1
)
SELECT id FROM d ORDER BY seq`

// Window is a time range of delivery creation: [Since, Until), Until nil
// meaning up to now.
type Window struct {
	Since time.Time
	Until *time.Time
}

// WindowError is a malformed window, naming the field ("since", "until")
// so the CLI and the admin API both point at it.
type WindowError struct {
	Field   string
	Message string
}

func (e *WindowError) Error() string { return e.Field + ": " + e.Message }

// ParseWindow reads a recover window, the one rule for the CLI and the
// admin API: each bound is an RFC 3339 time (2026-03-01T02:10:00Z) or a
// duration meaning that long before now (90m, 2h). since is required and
// not in the future (a window that starts later than now cannot hold a dead
// delivery: almost always a typo in the date); until, when given, is after
// since.
func ParseWindow(since, until string, now time.Time) (Window, error) {
	var w Window
	s, err := parseBound("since", since, now)
	if err != nil {
		return w, err
	}
	if s.After(now) {
		return w, &WindowError{"since", fmt.Sprintf("%s is in the future (now is %s)", s.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))}
	}
	w.Since = s
	if strings.TrimSpace(until) != "" {
		u, err := parseBound("until", until, now)
		if err != nil {
			return w, err
		}
		if !u.After(s) {
			return w, &WindowError{"until", fmt.Sprintf("%s is not after since (%s)", u.UTC().Format(time.RFC3339), s.UTC().Format(time.RFC3339))}
		}
		w.Until = &u
	}
	return w, nil
}

func parseBound(field, v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, &WindowError{field, "is required (an RFC 3339 time such as 2026-03-01T02:10:00Z, or a duration before now such as 2h)"}
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, &WindowError{field, fmt.Sprintf("%q: a duration means that long before now and must not be negative", v)}
		}
		return now.Add(-d), nil
	}
	return time.Time{}, &WindowError{field, fmt.Sprintf("%q is neither an RFC 3339 time (2026-03-01T02:10:00Z) nor a duration (2h)", v)}
}

// RecoverWindow revives every dead delivery of a subscription created in w
// and returns their ids oldest first. The caller checks that the
// subscription exists (an unknown one would revive nothing and say so as if
// the window were empty).
func (s *DeliveryStore) RecoverWindow(ctx context.Context, subscriptionID string, w Window) ([]int64, error) {
	id, err := ParseID(subscriptionID)
	if err != nil {
		return nil, err
	}
	out := []int64{}
	err = s.revive(ctx, recoverWindowSQL, []any{id, w.Since, w.Until}, func(rows pgx.Rows) error {
		var v int64
		err := rows.Scan(&v)
		out = append(out, v)
		return err
	})
	return out, err
}
