package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxbridge/bridge/internal/contract"
	"github.com/outboxbridge/bridge/internal/database/statement"
	"github.com/outboxbridge/bridge/internal/keyring"
)

// bridge.subscriptions ---------------------------------------------------------

// subscriptionColumns is the one column list of a Subscription, named as its
// db tags so pgx.RowToAddrOfStructByName maps them; every statement that
// returns a subscription ends with it.
var subscriptionColumns = `s.id::text AS id, s.url, s.description, s.event_types, coalesce(s.topic, '') AS topic, s.enabled,
       coalesce(s.disabled_reason, '') AS disabled_reason, s.disabled_at, s.consecutive_failures, s.created_at, s.updated_at,
       s.rate_limit, s.rate_burst, ` + historyColumn

var insertSubscriptionSQL = `
INSERT INTO bridge.subscriptions AS s (url, description, event_types, topic, history_since, rate_limit, rate_burst, rate_tokens)
VALUES ($1, $2, $3, nullif($4, ''), $5, $6::int, $7::int, $7::int)
RETURNING ` + subscriptionColumns

var getSubscriptionSQL = `SELECT ` + subscriptionColumns + ` FROM bridge.subscriptions s WHERE s.id = $1`

var listSubscriptionsSQL = `SELECT ` + subscriptionColumns + ` FROM bridge.subscriptions s ORDER BY s.created_at, s.id`

// updateSubscriptionSQL changes only the fields whose parameter is not NULL;
// $5 is the topic and $6 says whether to set it (an empty topic clears the
// filter). A new rate limit ($7, burst $8) starts with a full bucket.
var updateSubscriptionSQL = `
UPDATE bridge.subscriptions s SET
  url = coalesce($2, s.url),
  description = coalesce($3, s.description),
  event_types = coalesce($4, s.event_types),
  topic = CASE WHEN $6::boolean THEN nullif($5, '') ELSE s.topic END,
  rate_limit = coalesce($7::int, s.rate_limit),
  rate_burst = coalesce($8::int, s.rate_burst),
  rate_tokens = CASE WHEN $7::int IS NULL THEN s.rate_tokens ELSE $8::int END,
  rate_refilled_at = CASE WHEN $7::int IS NULL THEN s.rate_refilled_at ELSE now() END,
  updated_at = now()
WHERE s.id = $1
RETURNING ` + subscriptionColumns

var disableSubscriptionSQL = `
UPDATE bridge.subscriptions s SET enabled = false, disabled_reason = $2, disabled_at = now(), updated_at = now()
WHERE s.id = $1
RETURNING ` + subscriptionColumns

// enableSubscriptionSQL resets consecutive_failures: the operator says the
// endpoint is fixed, so the next death starts a new count.
var enableSubscriptionSQL = `
UPDATE bridge.subscriptions s SET enabled = true, disabled_reason = NULL, disabled_at = NULL,
  consecutive_failures = 0, updated_at = now()
WHERE s.id = $1
RETURNING ` + subscriptionColumns

const deleteSubscriptionSQL = `DELETE FROM bridge.subscriptions WHERE id = $1`

// routesSQL reads every subscription's routing rule for the consumer. It
// runs inside the consumer's batch transaction, so one batch is routed
// against one consistent set; the consumer's filter decides (disabled ones
// included), so the rule lives in Go in one place. The table holds one row
// per endpoint, not per event: small.
const routesSQL = `
SELECT s.id::text AS id, s.enabled, s.event_types, coalesce(s.topic, '') AS topic
FROM bridge.subscriptions s`

// Subscription is an endpoint and what it receives. Secret is set only in
// the answer to Create and RotateSecret: it is shown once.
type Subscription struct {
	ID                  string     `json:"id" db:"id"`
	URL                 string     `json:"url" db:"url"`
	Description         string     `json:"description" db:"description"`
	EventTypes          []string   `json:"event_types" db:"event_types"`
	Topic               string     `json:"topic,omitempty" db:"topic"`
	Enabled             bool       `json:"enabled" db:"enabled"`
	DisabledReason      string     `json:"disabled_reason,omitempty" db:"disabled_reason"`
	DisabledAt          *time.Time `json:"disabled_at,omitempty" db:"disabled_at"`
	ConsecutiveFailures int        `json:"consecutive_failures" db:"consecutive_failures"`
	CreatedAt           time.Time  `json:"created_at" db:"created_at"`
	UpdatedAt           time.Time  `json:"updated_at" db:"updated_at"`
	// RateLimit is requests per second across every deliverer (0:
	// unlimited), RateBurst how many may start at once (see RateInput).
	RateLimit int `json:"rate_limit,omitempty" db:"rate_limit"`
	RateBurst int `json:"rate_burst,omitempty" db:"rate_burst"`
	// History is the backfill `create --since` asked for (nil: none).
	History *History     `json:"history,omitempty" db:"history"`
	Secret  string       `json:"secret,omitempty" db:"-"`
	Secrets []SecretInfo `json:"secrets,omitempty" db:"-"`
}

// Route is a subscription as the consumer's router sees it.
type Route struct {
	ID         string   `db:"id"`
	Enabled    bool     `db:"enabled"`
	EventTypes []string `db:"event_types"`
	Topic      string   `db:"topic"`
}

// Routes reads every subscription's routing rule, in q's transaction.
func Routes(ctx context.Context, q Querier) ([]Route, error) {
	return statement.Select[Route](ctx, q, "load subscriptions", routesSQL)
}

// QueueRoutes queues Routes' read on b (the consumer sends it in one round
// trip with its transaction's other first statements); into is filled when
// the batch's results are read.
func QueueRoutes(b *pgx.Batch, into *[]Route) {
	b.Queue(routesSQL).Query(func(rows pgx.Rows) error {
		rs, err := pgx.CollectRows(rows, pgx.RowToStructByName[Route])
		if err != nil {
			return fmt.Errorf("load subscriptions: %w", err)
		}
		*into = rs
		return nil
	})
}

// SubscriptionStore manages subscriptions and their secrets.
type SubscriptionStore struct {
	db DB
	// AllowHTTP accepts http:// URLs (WEBHOOK_ALLOW_HTTP).
	AllowHTTP bool
	// checkHosts refuses a URL whose host is a blocked literal address
	// (CheckURLHost), except in allowedCIDRs (WithAllowedCIDRs).
	checkHosts   bool
	allowedCIDRs []netip.Prefix
	// SecretGrace: how long a rotated-out secret keeps signing
	// (WEBHOOK_SECRET_GRACE). Zero: it stops at once.
	SecretGrace time.Duration
	// Operations is the topic disables, enables and rotations are announced
	// on, in their own transaction (BRIDGE_OPERATIONS_TOPIC); "" announces
	// nothing.
	Operations string
	// keys seals the secrets it writes (WithKeys); nil writes plain text.
	keys *keyring.Ring
}

// NewSubscriptionStore returns a store on db.
func NewSubscriptionStore(db DB, allowHTTP bool, secretGrace time.Duration) *SubscriptionStore {
	return &SubscriptionStore{db: db, AllowHTTP: allowHTTP, SecretGrace: secretGrace}
}

// WithKeys makes the store seal the secrets it writes under keys
// (BRIDGE_SECRET_KEYS; nil: plain text) and returns it.
func (s *SubscriptionStore) WithKeys(keys *keyring.Ring) *SubscriptionStore {
	s.keys = keys
	return s
}

// WithAllowedCIDRs makes create and update refuse a URL whose host is a
// literal address the deliverer's dialer refuses (CheckURLHost), except in
// allowed (WEBHOOK_ALLOWED_CIDRS, the dialer's own exemptions). Every
// command and API that takes a subscription from a user calls it.
func (s *SubscriptionStore) WithAllowedCIDRs(allowed []netip.Prefix) *SubscriptionStore {
	s.checkHosts, s.allowedCIDRs = true, allowed
	return s
}

// SubscriptionInput is what create and update take; nil fields are left
// unchanged by Update.
type SubscriptionInput struct {
	URL         *string
	EventTypes  []string
	Topic       *string
	Description *string
	// Since (create only): start with every retained matching event since
	// then (history), before the live ones. nil: live events only.
	Since *time.Time
	// RateLimit: requests per second (0: unlimited; nil: unchanged);
	// RateBurst: the bucket's size, only with RateLimit (nil: the default,
	// DefaultRateBurst).
	RateLimit, RateBurst *int
}

// Bounds of a rate limit. Above MaxRateLimit a limit protects nobody (one
// deliverer does not send that many to one endpoint), and a burst above
// MaxRateBurst is a typo: it would let a backlog out all at once.
const (
	MaxRateLimit = 100_000
	MaxRateBurst = 100_000
)

// DefaultRateBurst is the burst of a rate limit given without one: a tenth
// of a second's worth, at least 1. A burst of a whole second (rate) would
// let twice the limit through in the first second after a pause, which is
// not what "no more than N a second" means to a subscriber; a burst of 1
// would make every token its own claim, which caps a high limit below
// itself.
func DefaultRateBurst(rate int) int { return max(1, (rate+9)/10) }

// CheckRate checks in's rate limit and burst, naming the field (the CLI
// checks its flags with it before connecting).
func (in SubscriptionInput) CheckRate() error {
	_, _, err := in.rate()
	return err
}

// rate resolves in's rate limit to the values stored (limit, burst), nil
// when it does not change; it checks them, naming the flag.
func (in SubscriptionInput) rate() (limit, burst *int, err error) {
	if in.RateLimit == nil {
		if in.RateBurst != nil {
			return nil, nil, &ValidationError{Field: "rate-burst", Problem: "needs a rate limit given with it (the burst is part of the limit)"}
		}
		return nil, nil, nil
	}
	l := *in.RateLimit
	if l < 0 || l > MaxRateLimit {
		return nil, nil, &ValidationError{Field: "rate-limit", Value: strconv.Itoa(l),
			Problem: fmt.Sprintf("must be from 1 to %d requests per second, or 0 for no limit", MaxRateLimit)}
	}
	b := 0
	switch {
	case l == 0 && in.RateBurst != nil && *in.RateBurst != 0:
		return nil, nil, &ValidationError{Field: "rate-burst", Value: strconv.Itoa(*in.RateBurst), Problem: "needs a rate limit above 0"}
	case l == 0:
	case in.RateBurst == nil:
		b = DefaultRateBurst(l)
	case *in.RateBurst < 1 || *in.RateBurst > MaxRateBurst:
		return nil, nil, &ValidationError{Field: "rate-burst", Value: strconv.Itoa(*in.RateBurst),
			Problem: fmt.Sprintf("must be from 1 to %d requests", MaxRateBurst)}
	default:
		b = *in.RateBurst
	}
	return &l, &b, nil
}

// ValidateURL accepts an absolute http(s) URL with a host; http only when
// allowHTTP. (Where it points is checked at dial time, on every attempt.)
func ValidateURL(raw string, allowHTTP bool) error {
	if n := utf8.RuneCountInString(raw); n > MaxURLLength {
		// Browsers, proxies and servers commonly refuse URLs past about
		// 2 KiB: one that long can never be delivered to.
		return &ValidationError{Field: "url", Value: shorten(raw), Problem: fmt.Sprintf("is %d characters long; at most %d are allowed", n, MaxURLLength)}
	}
	u, err := url.Parse(raw)
	if err != nil || raw == "" {
		return &ValidationError{Field: "url", Value: raw, Problem: "is not a valid URL"}
	}
	switch {
	case strings.ContainsAny(raw, " "):
		return &ValidationError{Field: "url", Value: raw, Problem: "must not contain spaces (percent-encode them as %20)"}
	case u.Port() != "" && !validPort(u.Port()):
		return &ValidationError{Field: "url", Value: raw, Problem: fmt.Sprintf("port %s is not a TCP port (1-65535)", u.Port())}
	case u.Scheme != "http" && u.Scheme != "https":
		return &ValidationError{Field: "url", Value: raw, Problem: "must be an absolute http:// or https:// URL"}
	case u.Host == "" || u.Hostname() == "":
		return &ValidationError{Field: "url", Value: raw, Problem: "has no host"}
	case u.User != nil:
		return &ValidationError{Field: "url", Value: raw, Problem: "must not carry credentials (user:password@); the signature authenticates the sender"}
	case u.Fragment != "":
		return &ValidationError{Field: "url", Value: raw, Problem: "must not have a #fragment"}
	case u.Scheme == "http" && !allowHTTP:
		return &ValidationError{Field: "url", Value: raw, Problem: "must use https (set WEBHOOK_ALLOW_HTTP=true to allow http)"}
	}
	return nil
}

// Bounds of what a subscription stores (the CLI and the API both go through
// the store). A 100 KB disable reason or a 10,000-character URL was
// accepted, stored and printed in every listing.
const (
	MaxURLLength    = 2048
	MaxReasonLength = 1024
)

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// shorten keeps an error about an over-long value readable.
func shorten(s string) string {
	if r := []rune(s); len(r) > 80 {
		return string(r[:80]) + "…"
	}
	return s
}

// validateEventTypes checks the patterns with contract.ValidateEventTypes
// (the one definition of what a pattern may be) and names the field.
func validateEventTypes(types []string) error {
	var pe *contract.PatternError
	if err := contract.ValidateEventTypes(types); errors.As(err, &pe) {
		return &ValidationError{Field: "event-types", Value: pe.Value, Problem: pe.Problem}
	} else if err != nil {
		return err
	}
	return nil
}

func validateTopic(t string) error {
	if strings.IndexFunc(t, unicode.IsSpace) >= 0 {
		return &ValidationError{Field: "topic", Value: t, Problem: "must not contain whitespace"}
	}
	return nil
}

// ParseID checks a subscription id is a UUID.
func ParseID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return "", &ValidationError{Field: "subscription id", Value: id, Problem: "is not a UUID"}
	}
	return u.String(), nil
}

func (s *SubscriptionStore) validate(in SubscriptionInput, create bool) error {
	if create && in.URL == nil {
		return &ValidationError{Field: "url", Problem: "is required"}
	}
	if in.URL != nil {
		if err := ValidateURL(*in.URL, s.AllowHTTP); err != nil {
			return err
		}
		if s.checkHosts {
			if err := CheckURLHost(*in.URL, s.allowedCIDRs); err != nil {
				return err
			}
		}
	}
	if create || in.EventTypes != nil {
		if err := validateEventTypes(in.EventTypes); err != nil {
			return err
		}
	}
	if in.Topic != nil {
		if err := validateTopic(*in.Topic); err != nil {
			return err
		}
	}
	if in.Since != nil && !create {
		return &ValidationError{Field: "since", Problem: "can only be given when the subscription is created"}
	}
	return in.CheckRate()
}

// querySubscription runs a statement that returns one subscription.
func querySubscription(ctx context.Context, q Querier, sql string, args ...any) (*Subscription, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowToAddrOfStructByName[Subscription])
}

// Create validates the input, stores the subscription with a fresh secret
// and returns it, secret included.
func (s *SubscriptionStore) Create(ctx context.Context, in SubscriptionInput) (*Subscription, error) {
	if err := s.validate(in, true); err != nil {
		return nil, err
	}
	secret := NewSecret()
	limit, burst, _ := in.rate()
	if limit == nil {
		limit, burst = new(int), new(int)
	}
	var sub *Subscription
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		if in.Since != nil {
			if err := checkSince(ctx, tx, *in.Since); err != nil {
				return err
			}
		}
		sub, err = querySubscription(ctx, tx, insertSubscriptionSQL, *in.URL, deref(in.Description), in.EventTypes, deref(in.Topic), in.Since,
			*limit, *burst)
		if err != nil {
			return err
		}
		return writeSecret(ctx, tx, s.keys, sub.ID, secret)
	})
	if err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			return nil, err
		}
		return nil, fmt.Errorf("create subscription: %w", err)
	}
	sub.Secret = secret
	return sub, nil
}

// Get returns a subscription with its secrets' metadata.
func (s *SubscriptionStore) Get(ctx context.Context, id string) (*Subscription, error) {
	id, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	sub, err := querySubscription(ctx, s.db, getSubscriptionSQL, id)
	if err != nil {
		return nil, notFound("subscription", id, err)
	}
	if sub.Secrets, err = listSecrets(ctx, s.db, id); err != nil {
		return nil, err
	}
	return sub, nil
}

// List returns every subscription, oldest first.
func (s *SubscriptionStore) List(ctx context.Context) ([]Subscription, error) {
	return statement.Select[Subscription](ctx, s.db, "list subscriptions", listSubscriptionsSQL)
}

// Update changes the non-nil fields of in.
func (s *SubscriptionStore) Update(ctx context.Context, id string, in SubscriptionInput) (*Subscription, error) {
	id, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	if err := s.validate(in, false); err != nil {
		return nil, err
	}
	var eventTypes any
	if in.EventTypes != nil {
		eventTypes = in.EventTypes
	}
	limit, burst, _ := in.rate()
	sub, err := querySubscription(ctx, s.db, updateSubscriptionSQL, id, in.URL, in.Description, eventTypes, deref(in.Topic), in.Topic != nil,
		limit, burst)
	if err != nil {
		return nil, notFound("subscription", id, err)
	}
	return sub, nil
}

// RotateSecret adds a new secret and gives the current one SecretGrace to
// live; both sign until then. The answer carries the new secret.
func (s *SubscriptionStore) RotateSecret(ctx context.Context, id string) (*Subscription, error) {
	id, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	secret := NewSecret()
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := querySubscription(ctx, tx, getSubscriptionSQL, id); err != nil {
			return notFound("subscription", id, err)
		}
		if err := rotateSecret(ctx, tx, s.keys, id, secret, s.SecretGrace); err != nil {
			return err
		}
		return s.announce(ctx, tx, id, contract.OpSubscriptionSecretRotated, func(now time.Time) any {
			return contract.SubscriptionSecretRotated{SubscriptionID: id, PreviousExpiresAt: now.Add(s.SecretGrace), RotatedAt: now}
		})
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("rotate secret: %w", err)
	}
	sub, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	sub.Secret = secret
	return sub, nil
}

// Disable stops deliveries to the subscription; its pending deliveries wait.
func (s *SubscriptionStore) Disable(ctx context.Context, id, reason string) (*Subscription, error) {
	id, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	if n := utf8.RuneCountInString(reason); n > MaxReasonLength {
		return nil, &ValidationError{Field: "reason", Value: shorten(reason), Problem: fmt.Sprintf("is %d characters long; at most %d are allowed", n, MaxReasonLength)}
	}
	if reason == "" {
		reason = "disabled by an operator"
	}
	var sub *Subscription
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		was, _, err := lockSubscriptionState(ctx, tx, id)
		if err != nil {
			return err
		}
		if sub, err = querySubscription(ctx, tx, disableSubscriptionSQL, id, reason); err != nil {
			return err
		}
		if !was {
			return nil // already disabled: nothing changed that is worth announcing
		}
		return s.announce(ctx, tx, id, contract.OpSubscriptionDisabled, func(now time.Time) any {
			return contract.SubscriptionDisabled{SubscriptionID: id, Cause: contract.CauseOperator, Reason: reason,
				ConsecutiveFailures: sub.ConsecutiveFailures, DisabledAt: now}
		})
	})
	if err != nil {
		return nil, notFound("subscription", id, err)
	}
	return sub, nil
}

// Enable resumes deliveries and resets the consecutive-failure count.
func (s *SubscriptionStore) Enable(ctx context.Context, id string) (*Subscription, error) {
	id, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	var sub *Subscription
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		was, reason, err := lockSubscriptionState(ctx, tx, id)
		if err != nil {
			return err
		}
		if sub, err = querySubscription(ctx, tx, enableSubscriptionSQL, id); err != nil {
			return err
		}
		if was {
			return nil // it was enabled: not a re-enable
		}
		return s.announce(ctx, tx, id, contract.OpSubscriptionEnabled, func(now time.Time) any {
			return contract.SubscriptionEnabled{SubscriptionID: id, PreviousReason: reason, EnabledAt: now}
		})
	})
	if err != nil {
		return nil, notFound("subscription", id, err)
	}
	return sub, nil
}

// lockSubscriptionStateSQL reads whether a subscription is enabled (and why
// not) and locks it, so a disable or enable announces the transition it
// made rather than one a concurrent statement made.
const lockSubscriptionStateSQL = `
SELECT enabled, coalesce(disabled_reason, '') FROM bridge.subscriptions WHERE id = $1 FOR UPDATE`

func lockSubscriptionState(ctx context.Context, tx pgx.Tx, id string) (enabled bool, reason string, err error) {
	err = tx.QueryRow(ctx, lockSubscriptionStateSQL, id).Scan(&enabled, &reason)
	return enabled, reason, err
}

// announce enqueues one operational event about subscription id in tx;
// payload gets the transaction's timestamp (the now() its UPDATE wrote).
func (s *SubscriptionStore) announce(ctx context.Context, tx pgx.Tx, id, eventType string, payload func(now time.Time) any) error {
	if s.Operations == "" {
		return nil
	}
	var now time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return err
	}
	return announce(ctx, tx, s.Operations, opEvent{asset: contract.OperationsAssetForSubscription(id), eventType: eventType, payload: payload(now)})
}

// Delete removes the subscription with its secrets, deliveries and log.
func (s *SubscriptionStore) Delete(ctx context.Context, id string) error {
	id, err := ParseID(id)
	if err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, deleteSubscriptionSQL, id)
	if err != nil {
		return fmt.Errorf("delete subscription: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("subscription %s: %w", id, ErrNotFound)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
