package relay

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// Claim: which rows a cycle may produce, in order.

// row is one claimed outbox row.
type row = outboxstore.Claimed

// claim reads the next batch. See outboxstore's claimSQL for where the scan
// starts: after the last row claimed while a drain is under way, and from the
// floor whenever the relay caught up or the poll interval passed.
func (r *Relay) claim(ctx context.Context, lanes []int, inflight *settlement) ([]*row, bool, error) {
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	if !slices.Equal(lanes, r.floorLanes) {
		// A lane just taken over may hold NEW rows anywhere below the floor.
		r.floor, r.floorLanes = 0, slices.Clone(lanes)
	}
	if low := r.lowered.Swap(math.MaxInt64); low < r.floor {
		r.floor = low
	}
	after := r.cursor
	fromFloor := after == 0 || time.Since(r.lastFloorScan) >= r.cfg.PollInterval
	if fromFloor {
		after = r.floor
		r.lastFloorScan = time.Now()
	}
	margin := r.cfg.LeaseTimeout / 2
	if late := r.lanes.sinceRenewed(); late > r.cfg.LeaseTimeout-margin && time.Since(r.fenceWarned) > 10*time.Second {
		// The fence refuses every claim now, and an empty claim looks like
		// an empty outbox: without this line a relay whose lease upkeep
		// cannot keep up (a starved machine, a slow disk under its commits)
		// stalls with its rows NEW and says nothing.
		r.fenceWarned = time.Now()
		r.log.WarnContext(ctx, "lane leases not renewed in time: the fence refuses claims until the upkeep catches up",
			"last_renewal_ago", late.Round(time.Millisecond), "lease", r.cfg.LeaseTimeout, "claim_needs_left", margin)
	}
	started := time.Now()
	// Raising the floor needs the in-flight floor, a read of pg_locks
	// (~0.4 ms, and it holds every lock-manager partition meanwhile: each
	// writer's xid lock waits for it). Busy, the relay claims 100–250 times
	// a second; raised at most every floorRaiseEvery, the floor trails by
	// the rows marked meanwhile (a few hundred index entries at 5,000/s).
	raiseFloor := fromFloor && time.Since(r.floorRaisedAt) >= floorRaiseEvery
	inflightFloor := int64(math.MaxInt64)
	var readInflight *int64
	if raiseFloor {
		readInflight = &inflightFloor
	}
	claimed, more, err := outboxstore.Claim(qctx, r.pool, outboxstore.ClaimParams{
		Member: r.cfg.MemberID, Lanes: lanes, Margin: margin,
		Limit: r.cfg.BatchSize, After: after, Floor: r.floor, Exclude: inflight.excluded(), Acked: inflight.acked(),
		MaxPayloadBytes: r.cfg.MaxMessageBytes, BatchBytes: r.cfg.BatchBytes, FreshPlan: r.freshPlans.Load(),
		// Streaming (the last claim took everything there was) claims a
		// few rows, and planning them cost twice their execution. A drain
		// (the resume cursor is set) keeps a plan made for its parameters:
		// the generic plan cannot know that LIMIT $2 stops the index walk
		// early.
		GenericPlan:   r.cursor == 0,
		InflightFloor: readInflight,
	})
	if err != nil {
		return nil, false, err
	}
	took := time.Since(started)
	if r.cfg.ClaimObserver != nil {
		r.cfg.ClaimObserver(took, len(claimed))
	}
	if took > slowClaim {
		r.wantStats() // a plan made on statistics that say "empty" is one cause
	}
	if raiseFloor && len(claimed) > 0 {
		r.floorRaisedAt = started
		// Nothing of these lanes is NEW below the lowest NEW row this
		// snapshot saw, and no transaction still in flight holds a seq
		// below the in-flight floor read just before it (migration 00160):
		// commits skip their notification while this relay is busy, so a
		// late commit cannot be the one to lower the floor. Rows replayed
		// below it are in r.lowered and apply to the next claim. An empty
		// claim keeps the old floor: lower than needed, never too high.
		r.floor = min(claimed[0].FloorSeq-1, inflightFloor)
	}
	if !more {
		r.cursor = 0 // caught up: the next claim starts from the floor
	} else {
		r.wantStats() // a backlog: are the planner's statistics still true?
		r.cursor = claimed[len(claimed)-1].Seq
	}
	return claimed, more, nil
}

// floorRaiseEvery: how often at most a claim raises the floor (see claim).
const floorRaiseEvery = 25 * time.Millisecond

// slowClaim: a claim slower than this makes the relay check the outbox's
// planner statistics (a claim of 1,000 rows takes 2–20 ms on a sound plan).
const slowClaim = 50 * time.Millisecond

// lowerFloor makes the next claim scan from seq above at most: rows from
// above+1 on may have become NEW below the floor. Safe from any goroutine.
func (r *Relay) lowerFloor(above int64) {
	for {
		cur := r.lowered.Load()
		if above >= cur || r.lowered.CompareAndSwap(cur, above) {
			return
		}
	}
}

// excluded are the seqs of the settlement being written (nil: none): NEW
// until it commits, and not to be claimed again meanwhile.
func (s *settlement) excluded() []int64 {
	if s == nil {
		return nil
	}
	return s.seqs
}

// acked maps each asset of the settlement being written to the highest
// asset_seq of it the broker acked (nil settlement: empty).
func (s *settlement) acked() map[string]int64 {
	out := map[string]int64{}
	if s == nil {
		return out
	}
	for _, i := range s.sent {
		w := s.rows[i]
		out[w.AssetKey()] = max(out[w.AssetKey()], w.AssetSeq)
	}
	return out
}

// inOrder keeps, per asset, only the claimed rows that can go out now: the
// asset's first claimed row must follow an event that is no longer NEW (or
// was acked in the batch whose outcome is being written), and the rows after
// it must continue its asset_seq without a gap. Rows it drops stay NEW and are
// claimed again by a later cycle, in order. This is what makes the claim's
// resume cursor safe (see outboxstore's claimSQL).
func (r *Relay) inOrder(claimed []*row, inflight *settlement) []*row {
	acked := inflight.acked()
	blocked := map[string]bool{}
	for _, w := range claimed {
		// Set on each asset's first row of the claim (see outboxstore).
		if p := w.PredecessorStatus; p != nil && *p == "NEW" && acked[w.AssetKey()] != w.AssetSeq-1 {
			blocked[w.AssetKey()] = true
		}
	}
	next := map[string]int64{}
	out := claimed[:0:0]
	for _, w := range claimed {
		k := w.AssetKey()
		if blocked[k] {
			continue
		}
		if want, ok := next[k]; ok && w.AssetSeq != want {
			blocked[k] = true // a gap: the missing row was not claimed
			continue
		}
		next[k] = w.AssetSeq + 1
		out = append(out, w)
	}
	return out
}

// sameTopicRuns keeps, per asset, only the leading rows that go to the same
// topic as the asset's first row in the batch. Records of one asset to one
// topic share a partition, and franz-go fails a partition's buffered records
// together, so a failure there cannot be overtaken. Records to another topic
// would be produced concurrently and could land while an earlier row of the
// asset is failing; they wait for the next cycle instead.
func sameTopicRuns(rows []*row) []*row {
	topicOf := map[string]string{}
	stopped := map[string]bool{}
	out := rows[:0:0]
	for _, w := range rows {
		k := w.AssetKey()
		if stopped[k] {
			continue
		}
		if t, seen := topicOf[k]; seen && t != w.Topic {
			stopped[k] = true
			continue
		}
		topicOf[k] = w.Topic
		out = append(out, w)
	}
	return out
}
