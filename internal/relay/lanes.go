package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// LaneCount is the number of relay lanes (bridge.lane_count() in migration
// 00001). Assets hash onto lanes; each lane is leased to one replica.
const LaneCount = 64

// laneKeeper holds this replica's lane leases: it renews them, takes its fair
// share of free or expired lanes (a dead replica's lanes come back after its
// lease expires), and hands extras back when replicas join — only what must
// move moves, so a membership change does not stop the world.
type laneKeeper struct {
	pool     *pgxpool.Pool
	memberID string
	hostname string
	lease    time.Duration
	logger   *slog.Logger

	mu    sync.Mutex
	owned map[int]struct{}
	// surplus is how many lanes this replica should give back; the relay
	// loop releases them between cycles, never under rows in flight.
	surplus int
	changed chan struct{}
	// kick makes the upkeep tick at once: another replica announced a
	// change of membership or released lanes (see announceSQL).
	kick chan struct{}
	// announce: the next tick tells the other replicas that this one is
	// here (set when this replica's LISTEN on the lanes channel is in place,
	// so it hears the lanes they release in answer).
	announce bool
	// dbMu serialises this replica's own statements over relay_lanes (the
	// upkeep tick and the loop's releases run on different connections; a
	// release and a renewal locking the same rows in different orders would
	// deadlock, and PostgreSQL only breaks that after deadlock_timeout).
	dbMu sync.Mutex
	// renewedAt is when the last successful renewal was sent: the leases it
	// renewed expire no earlier than a lease after it.
	renewedAt time.Time
}

func newLaneKeeper(pool *pgxpool.Pool, memberID, hostname string, lease time.Duration, logger *slog.Logger) *laneKeeper {
	return &laneKeeper{pool: pool, memberID: memberID, hostname: hostname, lease: lease, logger: logger,
		owned: map[int]struct{}{}, changed: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
}

// Owned returns the lanes held now, sorted.
func (k *laneKeeper) Owned() []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]int, 0, len(k.owned))
	for l := range k.owned {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

func (k *laneKeeper) notify() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// kickNow makes the upkeep tick at once (coalescing with a pending kick).
func (k *laneKeeper) kickNow() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// listening is called each time this replica's LISTEN on LanesChannel is in
// place: it announces itself on the next tick, which it makes at once.
func (k *laneKeeper) listening() {
	k.mu.Lock()
	k.announce = true
	k.mu.Unlock()
	k.kickNow()
}

// heard is called for each notification on LanesChannel.
func (k *laneKeeper) heard(from string) {
	if from != k.memberID {
		k.kickNow()
	}
}

func interval(d time.Duration) string { return outboxstore.Interval(d) }

// The statements over bridge.relay_lanes and bridge.relay_members (migration
// 00002); the fence every outbox mark carries is bridge.relay_fence (00010).

// heartbeatMemberSQL registers this replica (or extends its registration) so
// the others count it when they compute their fair share of lanes.
const heartbeatMemberSQL = `
INSERT INTO bridge.relay_members (member_id, hostname, expires_at)
VALUES ($1, $2, now() + $3::interval)
ON CONFLICT (member_id) DO UPDATE SET heartbeat_at = now(), expires_at = excluded.expires_at`

const liveMembersSQL = `SELECT count(*) FROM bridge.relay_members WHERE expires_at > now()`

const removeMemberSQL = `DELETE FROM bridge.relay_members WHERE member_id = $1`

// renewLanesSQL extends the leases this replica still holds. A lease that
// already expired is not renewed: another replica may have taken the lane, and
// this replica must treat it as lost (it can re-acquire it as a free lane).
const renewLanesSQL = `
UPDATE bridge.relay_lanes SET expires_at = now() + $2::interval
WHERE owner = $1 AND expires_at > now()
RETURNING lane`

// acquireLanesSQL takes up to $3 free or expired lanes. SKIP LOCKED: two
// replicas acquiring at once take disjoint lanes instead of waiting on each
// other. epoch counts changes of owner (visible to operators).
const acquireLanesSQL = `
UPDATE bridge.relay_lanes l SET owner = $1, epoch = l.epoch + 1, expires_at = now() + $2::interval
WHERE l.lane IN (
  SELECT lane FROM bridge.relay_lanes
  WHERE owner IS NULL OR expires_at <= now()
  ORDER BY lane
  LIMIT $3
  FOR UPDATE SKIP LOCKED)
RETURNING l.lane`

// releaseLanesSQL gives lanes back (scale-out or graceful shutdown) so
// another replica takes them at once instead of after the lease timeout.
const releaseLanesSQL = `
UPDATE bridge.relay_lanes SET owner = NULL, expires_at = '-infinity'
WHERE owner = $1 AND lane = ANY($2::int[])`

// LanesChannel is where replicas announce changes of lane ownership, with
// their member id as the payload: a replica that joined (once it listens),
// released surplus lanes, or stopped. Every replica ticks at once when it
// hears another: the one with too many lanes gives some back, the one with
// too few takes the free ones. Without it a lane released for a joining
// replica sat unowned — its rows waiting — until that replica's next tick
// (up to a fifth of the lease, 3 s by default), and a replica that joined
// waited for the others' ticks to be handed anything: the replicas' sum fell
// below one replica's rate. The fence is unchanged: a lane is only taken
// while free or expired, and only given back with none of its rows in
// flight. A lost notification costs only the delay: the ticker still runs.
const LanesChannel = "bridge_relay_lanes"

const announceSQL = `SELECT pg_notify('` + LanesChannel + `', $1)`

func (k *laneKeeper) announceChange(ctx context.Context, what string) {
	if _, err := k.pool.Exec(ctx, announceSQL, k.memberID); err != nil {
		k.logger.WarnContext(ctx, "announce lane change to other replicas", "change", what, "error", err)
	}
}

// tick renews, then rebalances toward this replica's fair share.
func (k *laneKeeper) tick(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.lease)
	defer cancel()
	k.dbMu.Lock()
	defer k.dbMu.Unlock()
	if _, err := k.pool.Exec(ctx, heartbeatMemberSQL, k.memberID, k.hostname, interval(k.lease)); err != nil {
		return fmt.Errorf("relay heartbeat: %w", err)
	}
	renewing := time.Now()
	rows, err := k.pool.Query(ctx, renewLanesSQL, k.memberID, interval(k.lease))
	if err != nil {
		return fmt.Errorf("renew lane leases: %w", err)
	}
	renewed := map[int]struct{}{}
	for rows.Next() {
		var lane int
		if err := rows.Scan(&lane); err != nil {
			rows.Close()
			return fmt.Errorf("renew lane leases: %w", err)
		}
		renewed[lane] = struct{}{}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("renew lane leases: %w", err)
	}
	var members int
	if err := k.pool.QueryRow(ctx, liveMembersSQL).Scan(&members); err != nil {
		return fmt.Errorf("count relay members: %w", err)
	}
	members = max(members, 1)
	target := int(math.Ceil(float64(LaneCount) / float64(members)))

	var acquired []int
	if len(renewed) < target {
		rows, err := k.pool.Query(ctx, acquireLanesSQL, k.memberID, interval(k.lease), target-len(renewed))
		if err != nil {
			return fmt.Errorf("acquire lanes: %w", err)
		}
		for rows.Next() {
			var lane int
			if err := rows.Scan(&lane); err != nil {
				rows.Close()
				return fmt.Errorf("acquire lanes: %w", err)
			}
			acquired = append(acquired, lane)
			renewed[lane] = struct{}{}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("acquire lanes: %w", err)
		}
	}

	k.mu.Lock()
	lost := 0
	for l := range k.owned {
		if _, ok := renewed[l]; !ok {
			lost++
		}
	}
	k.owned = renewed
	k.renewedAt = renewing
	k.surplus = max(0, len(renewed)-target)
	surplus := k.surplus
	announce := k.announce
	k.announce = false
	k.mu.Unlock()
	if announce {
		// After the heartbeat above: a replica that hears this counts this
		// one among the members.
		k.announceChange(ctx, "joined")
	}
	if lost > 0 {
		k.logger.WarnContext(ctx, "lost lane leases (expired before renewal)", "lanes_lost", lost)
	}
	if len(acquired) > 0 {
		k.logger.InfoContext(ctx, "acquired lanes", "lanes", acquired, "members", members, "owned", len(renewed))
	}
	if len(acquired) > 0 || lost > 0 || surplus > 0 {
		k.notify()
	}
	return nil
}

// sinceRenewed is how long ago the last successful renewal was sent.
func (k *laneKeeper) sinceRenewed() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return time.Since(k.renewedAt)
}

func (k *laneKeeper) hasSurplus() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.surplus > 0
}

// releaseSurplus hands back lanes above the fair share. Called by the relay
// loop between cycles, when none of this replica's rows are in flight.
func (k *laneKeeper) releaseSurplus(ctx context.Context) {
	// Held from the choice to the release: a tick in between would renew
	// the chosen lanes and put them back in owned after they were released,
	// and the claims' fence would refuse every lane set until the next tick.
	k.dbMu.Lock()
	defer k.dbMu.Unlock()
	k.mu.Lock()
	n := k.surplus
	if n == 0 {
		k.mu.Unlock()
		return
	}
	owned := make([]int, 0, len(k.owned))
	for l := range k.owned {
		owned = append(owned, l)
	}
	slices.Sort(owned)
	give := owned[len(owned)-n:]
	for _, l := range give {
		delete(k.owned, l)
	}
	k.surplus = 0
	k.mu.Unlock()
	if _, err := k.pool.Exec(ctx, releaseLanesSQL, k.memberID, give); err != nil {
		k.logger.WarnContext(ctx, "release surplus lanes", "error", err)
		return
	}
	k.announceChange(ctx, "released")
	k.logger.InfoContext(ctx, "released lanes to other replicas", "lanes", give)
}

// releaseAll gives every lane back and deregisters (graceful shutdown), so
// the other replicas take over at once rather than after the lease timeout.
func (k *laneKeeper) releaseAll(ctx context.Context) {
	k.dbMu.Lock()
	defer k.dbMu.Unlock()
	owned := k.Owned()
	k.mu.Lock()
	k.owned = map[int]struct{}{}
	k.mu.Unlock()
	// Deregistered before the announcement: the replicas that hear it count
	// one member less and take their larger share of the lanes.
	defer k.announceChange(ctx, "stopped")
	if len(owned) > 0 {
		if _, err := k.pool.Exec(ctx, releaseLanesSQL, k.memberID, owned); err != nil {
			k.logger.WarnContext(ctx, "release lanes on shutdown", "error", err)
		}
	}
	if _, err := k.pool.Exec(ctx, removeMemberSQL, k.memberID); err != nil {
		k.logger.WarnContext(ctx, "deregister relay member", "error", err)
	}
}
