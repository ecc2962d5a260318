package relay

import (
	"context"
	"errors"
	"slices"
	"sort"
	"time"

	"github.com/outboxbridge/bridge/internal/database"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

// Claim: which events a cycle produces, in order. The relay reads the log in
// batches per group of lanes that share a position (see outboxstore's
// batchSQL), and the rows held in bridge.outbox_held that are due.

// row is one event a cycle produces.
type row = outboxstore.Claimed

// laneGroup is a set of owned lanes at the same position, and the batch
// being read for them. Only the relay loop touches it.
type laneGroup struct {
	lanes []int
	// prev is the lanes' position: everything its snapshot sees was passed.
	prev string
	// cur ends the batch being read ("" : none open); afterXid/afterSeq is
	// the key of the last row read of it.
	cur                string
	afterXid, afterSeq int64
	// saved is the position last handed to a settlement to save.
	saved outboxstore.Position
	// deferred holds, per asset, rows read before their predecessor (see
	// outboxstore's batchSQL), in asset_seq order.
	deferred map[string][]*row
}

func (g *laneGroup) rewind() {
	g.afterXid, g.afterSeq = 0, 0
	g.deferred = map[string][]*row{}
}

// position is where the group is: its batch read in part counts only while
// no row of it waits for its predecessor.
func (g *laneGroup) position() outboxstore.Position {
	if g.cur == "" || len(g.deferred) > 0 || (g.afterXid == 0 && g.afterSeq == 0) {
		return outboxstore.Position{Tick: g.prev}
	}
	return outboxstore.Position{Tick: g.prev, BatchEnd: g.cur, AfterXid: g.afterXid, AfterSeq: g.afterSeq}
}

// knownLimit bounds the map of the last asset_seq produced per asset; past
// it the map starts over (it only saves predecessor lookups).
const knownLimit = 200000

// claimed is what one claim returns.
type claimed struct {
	rows []*row // to produce, per asset in asset_seq order
	hold []*row // log rows to hold behind their asset's held rows
	more bool
}

// syncGroups makes the groups cover exactly the owned lanes: lanes no longer
// owned leave their group, lanes just acquired join a group at the position
// stored for them.
func (r *Relay) syncGroups(ctx context.Context, lanes []int) error {
	have := map[int]bool{}
	owned := map[int]bool{}
	for _, l := range lanes {
		owned[l] = true
	}
	groups := r.groups[:0]
	for _, g := range r.groups {
		g.lanes = slices.DeleteFunc(g.lanes, func(l int) bool { return !owned[l] })
		// Rows of a lane that moved away are its new owner's to send.
		for k, ws := range g.deferred {
			if ws = slices.DeleteFunc(ws, func(w *row) bool { return !owned[w.Lane] }); len(ws) == 0 {
				delete(g.deferred, k)
			} else {
				g.deferred[k] = ws
			}
		}
		if len(g.lanes) > 0 {
			groups = append(groups, g)
			for _, l := range g.lanes {
				have[l] = true
			}
		}
	}
	r.groups = groups
	var added []int
	for _, l := range lanes {
		if !have[l] {
			added = append(added, l)
		}
	}
	if len(added) == 0 {
		return nil
	}
	positions, err := outboxstore.LanePositions(ctx, r.pool, added)
	if err != nil {
		return err
	}
	byPos := map[outboxstore.Position]*laneGroup{}
	for _, l := range added {
		p := positions[l]
		if p.Tick == "" {
			p = outboxstore.Position{Tick: "1:1:"}
		}
		g := byPos[p]
		if g == nil {
			g = &laneGroup{prev: p.Tick, cur: p.BatchEnd, afterXid: p.AfterXid, afterSeq: p.AfterSeq, saved: p,
				deferred: map[string][]*row{}}
			byPos[p] = g
			r.groups = append(r.groups, g)
		}
		g.lanes = append(g.lanes, l)
	}
	return nil
}

// mergeGroups joins groups at the same position with no batch open.
func (r *Relay) mergeGroups() {
	if len(r.groups) < 2 {
		return
	}
	byTick := map[string]*laneGroup{}
	out := r.groups[:0]
	for _, g := range r.groups {
		if g.cur == "" && len(g.deferred) == 0 {
			if o := byTick[g.prev]; o != nil {
				o.lanes = append(o.lanes, g.lanes...)
				slices.Sort(o.lanes)
				continue
			}
			byTick[g.prev] = g
		}
		out = append(out, g)
	}
	r.groups = out
}

// checkpoint is the read state of every group before
// a claim: restored when what the claim read cannot be settled — an outage,
// or a settlement that could not be written — so the lanes read it again.
// What was produced of it goes out again with the same dedup-ids.
type checkpoint struct {
	groups []laneGroup
	// server: the server the groups' positions were read from; a
	// checkpoint from another one is never restored (see forgetPositions).
	server string
}

func (r *Relay) checkpoint() *checkpoint {
	cp := &checkpoint{server: r.server}
	for _, g := range r.groups {
		c := *g
		c.lanes = slices.Clone(g.lanes)
		c.deferred = make(map[string][]*row, len(g.deferred))
		for k, v := range g.deferred {
			c.deferred[k] = slices.Clone(v)
		}
		cp.groups = append(cp.groups, c)
	}
	return cp
}

// errServerChanged: the read came from a PostgreSQL server other than the
// one the relay's positions in memory were read from (a restart, or a
// standby promoted).
var errServerChanged = errors.New("the database server restarted or failed over: the lanes' positions are read again from bridge.relay_positions")

// forgetPositions drops what the relay holds in memory about its lanes —
// positions, batches read in part, the last asset_seq produced per asset —
// so the next claim reads the saved positions again, as a relay that just
// took the lanes over does. A snapshot taken before PostgreSQL restarted or
// failed over cannot be used after: the transaction ids the old server gave
// to transactions that rolled back, whose WAL never reached the disk or the
// standby, are given out again, and that snapshot counts them as already
// passed, so their events would be skipped. A saved position is safe: it
// reached the standby (or the disk) only after every WAL record before it.
func (r *Relay) forgetPositions() {
	r.groups = nil
	r.known = map[string]int64{}
	r.savedAt = time.Time{}
	r.prefetched = nil
}

// restore goes back to cp (nil: nothing to restore). A checkpoint taken
// before the server changed is not restored: the positions are read again.
func (r *Relay) restore(cp *checkpoint) {
	if cp == nil {
		return
	}
	if cp.server != r.server {
		r.forgetPositions()
		return
	}
	r.groups = r.groups[:0]
	for i := range cp.groups {
		g := cp.groups[i]
		r.groups = append(r.groups, &g)
	}
}

// claim reads the next rows to produce: the held rows that are due, then a
// page of each group's batch.
func (r *Relay) claim(ctx context.Context, lanes []int, inflight *settlement) (claimed, error) {
	qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
	defer cancel()
	var out claimed
	if err := r.syncGroups(qctx, lanes); err != nil {
		return out, err
	}
	r.mergeGroups()
	margin := r.cfg.LeaseTimeout / 2
	if late := r.lanes.sinceRenewed(); late > r.cfg.LeaseTimeout-margin && time.Since(r.fenceWarned) > 10*time.Second {
		// The fence refuses every read now, and an empty batch looks like
		// an empty outbox: without this line a relay whose lease upkeep
		// cannot keep up (a starved machine, a slow disk under its commits)
		// stalls and says nothing.
		r.fenceWarned = time.Now()
		r.log.WarnContext(ctx, "lane leases not renewed in time: the fence refuses reads until the upkeep catches up",
			"last_renewal_ago", late.Round(time.Millisecond), "lease", r.cfg.LeaseTimeout, "claim_needs_left", margin)
	}
	started := time.Now()
	// One round trip: the held rows that are due and a page of each
	// group's batch; a group with no batch open starts one that ends at
	// the read's snapshot. During a backlog it was read while the
	// previous page was produced (see prefetch).
	read := r.nextRead(lanes, margin)
	opened := make([]bool, len(r.groups))
	for i, g := range r.groups {
		if g.cur == "" {
			g.rewind()
			opened[i] = true
		}
	}
	res, err := r.readCycle(qctx, read, margin)
	if err != nil {
		return out, err
	}
	if res.Fenced {
		// The fence refused the read: its pages are empty whatever the
		// lanes hold. Taken as the end of the batches, it would move the
		// groups' positions to this read's snapshot past rows never read,
		// and a position saved within the lease (saves need no margin) would
		// lose them for good. Nothing is claimed and nothing moves: the
		// batches it would have opened stay unopened.
		return out, nil
	}
	if r.server != res.Server {
		first := r.server == ""
		r.server = res.Server
		if !first {
			return out, errServerChanged
		}
	}
	// A held row whose outcome is still being written is not sent twice.
	inSettlement := inflight.ids()
	// Nor does an asset whose held row failed in it go on meanwhile.
	for _, w := range res.Held {
		if !inSettlement[w.ID.String()] && !inflight.failing(w.AssetKey()) {
			out.rows = append(out.rows, w)
		}
	}

	for i, g := range r.groups {
		if opened[i] {
			g.cur = res.Snapshot
		}
		page, more := res.Pages[i], res.More[i]
		if n := len(page); n > 0 {
			g.afterXid, g.afterSeq = page[n-1].Xid, page[n-1].Seq
		}
		r.takePage(g, page, inflight, &out)
		if more {
			out.more = true
			continue
		}
		// The batch is read: the lanes have passed g.cur once this cycle's
		// outcomes are written.
		if len(g.deferred) > 0 {
			// Cannot happen while writers of one asset are serialised: a
			// deferred row's predecessor is in the same batch. Produce them
			// rather than lose them.
			r.log.WarnContext(ctx, "rows whose predecessor was not found in their batch; producing them", "assets", len(g.deferred))
			for k, ws := range g.deferred {
				out.rows = append(out.rows, ws...)
				delete(g.deferred, k)
			}
		}
		g.prev, g.cur = g.cur, ""
		g.afterXid, g.afterSeq = 0, 0
	}
	took := time.Since(started)
	if r.cfg.ClaimObserver != nil {
		r.cfg.ClaimObserver(took, len(out.rows)+len(out.hold))
	}
	for _, w := range out.rows {
		r.known[w.AssetKey()] = w.AssetSeq
	}
	if len(r.known) > knownLimit {
		r.known = map[string]int64{}
	}
	return out, nil
}

// nextRead is what the next claim reads (CycleParams) for the groups as
// they are; it changes nothing.
func (r *Relay) nextRead(lanes []int, margin time.Duration) outboxstore.CycleParams {
	read := outboxstore.CycleParams{Member: r.cfg.MemberID, Lanes: slices.Clone(lanes), Margin: margin,
		HeldLimit: r.cfg.BatchSize, MaxPayloadBytes: r.cfg.MaxMessageBytes}
	for _, g := range r.groups {
		b := outboxstore.BatchParams{Lanes: slices.Clone(g.lanes), Prev: g.prev, Cur: g.cur,
			Limit: r.cfg.BatchSize, BatchBytes: r.cfg.BatchBytes, Known: r.known}
		if g.cur != "" {
			b.AfterXid, b.AfterSeq = g.afterXid, g.afterSeq
		}
		read.Batches = append(read.Batches, b)
	}
	return read
}

// prefetch is the next claim's read, started while a backlog's page is
// produced: the cycle is otherwise serial (read, produce, wait for the
// acks, read again), and the database and the broker each waited for the
// other. It reads only; the claim that takes it sorts its rows against the
// settlement then in flight, as for any read made while a settlement is
// written.
type prefetch struct {
	read    outboxstore.CycleParams
	started time.Time
	done    chan struct{}
	res     outboxstore.CycleRead
	err     error
}

// startPrefetch reads what the next claim will read, in the background,
// once the settlement before the page being produced (prev) is written: a
// read from before it could miss the holds it writes. Only the relay loop
// calls it, after a claim.
func (r *Relay) startPrefetch(ctx context.Context, lanes []int, prev *settlement) {
	p := &prefetch{read: r.nextRead(lanes, r.cfg.LeaseTimeout/2), started: time.Now(), done: make(chan struct{})}
	r.prefetched = p
	go func() {
		defer close(p.done)
		if prev != nil {
			<-prev.done
			if prev.err != nil {
				p.err = prev.err // its rows are read again: this read is not the next one
				return
			}
		}
		qctx, cancel := context.WithTimeout(ctx, database.QueryTimeout)
		defer cancel()
		p.res, p.err = outboxstore.ReadCycle(qctx, r.pool, p.read)
	}()
}

// readCycle returns the prefetched read when it is the one asked for —
// the same groups at the same keys, the same lanes — and recent enough for
// the fence it passed to still hold with half its margin; otherwise it
// reads now. A prefetch still running is waited for either way: it reads
// the map of known assets, which the claim then updates.
func (r *Relay) readCycle(ctx context.Context, read outboxstore.CycleParams, margin time.Duration) (outboxstore.CycleRead, error) {
	if p := r.prefetched; p != nil {
		r.prefetched = nil
		<-p.done
		if p.err == nil && time.Since(p.started) < margin/2 && sameRead(p.read, read) {
			return p.res, nil
		}
	}
	return outboxstore.ReadCycle(ctx, r.pool, read)
}

// sameRead says whether two reads ask for the same rows (the known assets
// only spare predecessor checks).
func sameRead(a, b outboxstore.CycleParams) bool {
	if a.Member != b.Member || a.Margin != b.Margin || a.HeldLimit != b.HeldLimit || a.MaxPayloadBytes != b.MaxPayloadBytes ||
		!slices.Equal(a.Lanes, b.Lanes) || len(a.Batches) != len(b.Batches) {
		return false
	}
	for i := range a.Batches {
		x, y := a.Batches[i], b.Batches[i]
		if !slices.Equal(x.Lanes, y.Lanes) || x.Prev != y.Prev || x.Cur != y.Cur || x.AfterXid != y.AfterXid ||
			x.AfterSeq != y.AfterSeq || x.Limit != y.Limit || x.BatchBytes != y.BatchBytes {
			return false
		}
	}
	return true
}

// takePage sorts one page of a group's batch into rows to produce now, rows
// to hold (their asset has held rows, or a row of it is failing in the
// settlement being written) and rows that wait for their predecessor.
func (r *Relay) takePage(g *laneGroup, page []*row, inflight *settlement, out *claimed) {
	divert := map[string]bool{}
	for _, w := range page {
		k := w.AssetKey()
		if divert[k] || w.AssetHeld || inflight.failing(k) {
			divert[k] = true
			if d := g.deferred[k]; len(d) > 0 {
				out.hold = append(out.hold, d...)
				delete(g.deferred, k)
			}
			out.hold = append(out.hold, w)
			continue
		}
		if d := g.deferred[k]; len(d) > 0 && w.AssetSeq > d[0].AssetSeq || w.PredecessorPending {
			d = append(g.deferred[k], w)
			sort.Slice(d, func(i, j int) bool { return d[i].AssetSeq < d[j].AssetSeq })
			g.deferred[k] = d
			continue
		}
		out.rows = append(out.rows, w)
		next := w.AssetSeq + 1
		for d := g.deferred[k]; len(d) > 0 && d[0].AssetSeq == next; d = g.deferred[k] {
			out.rows = append(out.rows, d[0])
			next++
			if len(d) == 1 {
				delete(g.deferred, k)
			} else {
				g.deferred[k] = d[1:]
			}
		}
	}
}

// ids are the held rows of the settlement being written (nil: none), by id.
func (s *settlement) ids() map[string]bool {
	out := map[string]bool{}
	if s == nil {
		return out
	}
	for _, w := range s.rows {
		if w.Held {
			out[w.ID.String()] = true
		}
	}
	return out
}

// failing says whether asset k has a row that failed in the settlement
// being written: its hold is not written yet, so the next batch must hold
// the asset's later rows instead of producing them.
func (s *settlement) failing(k string) bool {
	return s != nil && s.unsettled[k]
}

// sameTopicRuns keeps, per asset, only the leading rows that go to the same
// topic as the asset's first row in the batch, and returns the others apart.
// Records of one asset to one topic share a partition, and franz-go fails a
// partition's buffered records together, so a failure there cannot be
// overtaken. Records to another topic would be produced concurrently and
// could land while an earlier row of the asset is failing; they are held
// (log rows are copied into bridge.outbox_held) and go out in order once the
// earlier ones did.
func sameTopicRuns(rows []*row) (keep, rest []*row) {
	topicOf := map[string]string{}
	stopped := map[string]bool{}
	for _, w := range rows {
		k := w.AssetKey()
		if stopped[k] {
			rest = append(rest, w)
			continue
		}
		if t, seen := topicOf[k]; seen && t != w.Topic {
			stopped[k] = true
			rest = append(rest, w)
			continue
		}
		topicOf[k] = w.Topic
		keep = append(keep, w)
	}
	return keep, rest
}
