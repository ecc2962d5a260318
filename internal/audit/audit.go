// Package audit is the bridge's audit log (bridge.audit_log, migration
// 00190): one row per state-changing action of the console and of the admin
// API — who (the admin token's id), when, from where, what, on which scope,
// and how many rows it changed. Never a payload, a header value or a secret.
// `bridge audit list` and the console's Audit page read it.
package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxbridge/bridge/internal/database/statement"
)

// Via names the door an action came through.
const (
	ViaConsole = "console"
	ViaAPI     = "api"
)

// The actions, as they are stored and listed (the names are part of what
// `bridge audit list -o json` prints: add, never rename).
const (
	OutboxReplayIDs      = "outbox.replay"           // selected FAILED rows
	OutboxReplayMatching = "outbox.replay_matching"  // every FAILED row matching a filter
	DeliveriesRevive     = "deliveries.revive"       // selected dead deliveries
	DeliveriesReviveSub  = "deliveries.revive_all"   // every dead delivery of a subscription
	DeliveriesRecover    = "deliveries.recover"      // dead deliveries of a subscription in a window
	SubscriptionCreate   = "subscription.create"     //
	SubscriptionUpdate   = "subscription.update"     //
	SubscriptionRotate   = "subscription.rotate"     // a new signing secret
	SubscriptionDisable  = "subscription.disable"    //
	SubscriptionEnable   = "subscription.enable"     //
	SubscriptionDelete   = "subscription.delete"     //
	SubscriptionTest     = "subscription.test_event" // a test delivery queued
)

// Entry is one audited action.
type Entry struct {
	ID     int64     `json:"id" db:"id"`
	At     time.Time `json:"at" db:"at"`
	Actor  string    `json:"actor" db:"actor"`
	Via    string    `json:"via" db:"via"`
	Remote string    `json:"remote" db:"remote"`
	Action string    `json:"action" db:"action"`
	// Target is what the action names (a subscription id, a delivery id,
	// an outbox row id); "" for an action over a filter.
	Target string `json:"target" db:"target"`
	// Scope is what the operator asked for: the filter ("topic=orders"),
	// the window, or how many ids were selected.
	Scope string `json:"scope" db:"scope"`
	// Rows is how many rows the action changed.
	Rows int64 `json:"rows" db:"row_count"`
}

const insertSQL = `
INSERT INTO bridge.audit_log (actor, via, remote, action, target, scope, row_count)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

// listSQL pages newest first by id ($2: the last id of the previous page,
// NULL for the first).
const listSQL = `
SELECT id, at, actor, via, remote, action, target, scope, row_count
FROM bridge.audit_log
WHERE ($2::bigint IS NULL OR id < $2)
ORDER BY id DESC
LIMIT $1`

// Record writes e (its ID and At are set by the database).
func Record(ctx context.Context, db statement.DB, e Entry) error {
	if _, err := db.Exec(ctx, insertSQL, e.Actor, e.Via, e.Remote, e.Action, e.Target, e.Scope, e.Rows); err != nil {
		return fmt.Errorf("write audit log (%s): %w", e.Action, err)
	}
	return nil
}

// List returns up to limit entries newest first, after cursor (the previous
// page's next cursor; "" for the first page), and the next cursor ("" on
// the last page).
func List(ctx context.Context, db statement.DB, limit int, cursor string) ([]Entry, string, error) {
	if limit < 1 || limit > 1000 {
		return nil, "", fmt.Errorf("limit %d: must be between 1 and 1000", limit)
	}
	var after any
	if cursor != "" {
		n, err := strconv.ParseInt(cursor, 10, 64)
		if err != nil || n <= 0 {
			return nil, "", fmt.Errorf("cursor %q is not a cursor from a previous page", cursor)
		}
		after = n
	}
	es, err := statement.Select[Entry](ctx, db, "list audit log", listSQL, limit+1, after)
	if err != nil {
		return nil, "", err
	}
	if len(es) > limit {
		return es[:limit], strconv.FormatInt(es[limit-1].ID, 10), nil
	}
	return es, "", nil
}

// TokenID names a token without revealing it: "token:" and the first 8 hex
// digits of its SHA-256.
func TokenID(token string) string {
	return DigestID(sha256.Sum256([]byte(strings.TrimSpace(token))))
}

// DigestID is TokenID from the token's SHA-256 (for a holder that keeps
// only the digest).
func DigestID(sum [sha256.Size]byte) string { return "token:" + hex.EncodeToString(sum[:4]) }

// Remote is where a request came from: its peer's address, and the
// X-Forwarded-For a proxy added (recorded as told, not trusted).
func Remote(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if f := strings.TrimSpace(r.Header.Get("X-Forwarded-For")); f != "" {
		return host + " (for " + f[:min(len(f), 200)] + ")"
	}
	return host
}

// WindowScope is the scope of a recover: "dead, created since T[ until U]".
func WindowScope(since time.Time, until *time.Time) string {
	s := "dead, created since " + since.UTC().Format(time.RFC3339)
	if until != nil {
		s += " until " + until.UTC().Format(time.RFC3339)
	}
	return s
}
