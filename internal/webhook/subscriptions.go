package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxbridge/bridge/internal/contract"
)

// DB is what the stores need from PostgreSQL; *pgxpool.Pool satisfies it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ErrNotFound is returned for an unknown subscription or delivery id.
var ErrNotFound = errors.New("not found")

// ValidationError names the input field at fault (the CLI exits 2 with it).
type ValidationError struct {
	Field   string
	Value   string
	Problem string
}

func (e *ValidationError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s %s", e.Field, e.Problem)
	}
	return fmt.Sprintf("%s %q %s", e.Field, e.Value, e.Problem)
}

// Subscription is an endpoint and what it receives. Secret is set only in
// the answer to Create and RotateSecret: it is shown once.
type Subscription struct {
	ID                  string       `json:"id"`
	URL                 string       `json:"url"`
	Description         string       `json:"description"`
	EventTypes          []string     `json:"event_types"`
	Topic               string       `json:"topic,omitempty"`
	Enabled             bool         `json:"enabled"`
	DisabledReason      string       `json:"disabled_reason,omitempty"`
	DisabledAt          *time.Time   `json:"disabled_at,omitempty"`
	ConsecutiveFailures int          `json:"consecutive_failures"`
	CreatedAt           time.Time    `json:"created_at"`
	UpdatedAt           time.Time    `json:"updated_at"`
	Secret              string       `json:"secret,omitempty"`
	Secrets             []SecretInfo `json:"secrets,omitempty"`
}

// SecretInfo describes a valid signing secret without revealing it.
type SecretInfo struct {
	ID        int64      `json:"id"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// SubscriptionStore manages subscriptions and their secrets.
type SubscriptionStore struct {
	db DB
	// AllowHTTP accepts http:// URLs (WEBHOOK_ALLOW_HTTP).
	AllowHTTP bool
	// SecretGrace: how long a rotated-out secret keeps signing
	// (WEBHOOK_SECRET_GRACE). Zero: it stops at once.
	SecretGrace time.Duration
}

// NewSubscriptionStore returns a store on db.
func NewSubscriptionStore(db DB, allowHTTP bool, secretGrace time.Duration) *SubscriptionStore {
	return &SubscriptionStore{db: db, AllowHTTP: allowHTTP, SecretGrace: secretGrace}
}

// SubscriptionInput is what create and update take; nil fields are left
// unchanged by Update.
type SubscriptionInput struct {
	URL         *string
	EventTypes  []string
	Topic       *string
	Description *string
}

// ValidateURL accepts an absolute http(s) URL with a host; http only when
// allowHTTP. (Where it points is checked at dial time, on every attempt.)
func ValidateURL(raw string, allowHTTP bool) error {
	u, err := url.Parse(raw)
	if err != nil || raw == "" {
		return &ValidationError{Field: "url", Value: raw, Problem: "is not a valid URL"}
	}
	switch {
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
	return nil
}

// Create validates the input, stores the subscription with a fresh secret
// and returns it, secret included.
func (s *SubscriptionStore) Create(ctx context.Context, in SubscriptionInput) (*Subscription, error) {
	if err := s.validate(in, true); err != nil {
		return nil, err
	}
	secret := NewSecret()
	var sub *Subscription
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		sub, err = scanSubscription(tx.QueryRow(ctx, insertSubscriptionSQL, *in.URL, deref(in.Description), in.EventTypes, deref(in.Topic)))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, insertSecretSQL, sub.ID, secret)
		return err
	})
	if err != nil {
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
	sub, err := scanSubscription(s.db.QueryRow(ctx, getSubscriptionSQL, id))
	if err != nil {
		return nil, notFound("subscription", id, err)
	}
	rows, err := s.db.Query(ctx, listSecretsSQL, id)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	sub.Secrets, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (SecretInfo, error) {
		var si SecretInfo
		err := r.Scan(&si.ID, &si.CreatedAt, &si.ExpiresAt)
		return si, err
	})
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	return sub, nil
}

// List returns every subscription, oldest first.
func (s *SubscriptionStore) List(ctx context.Context) ([]Subscription, error) {
	rows, err := s.db.Query(ctx, listSubscriptionsSQL)
	if err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Subscription, error) {
		sub, err := scanSubscription(r)
		if err != nil {
			return Subscription{}, err
		}
		return *sub, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}
	return out, nil
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
	sub, err := scanSubscription(s.db.QueryRow(ctx, updateSubscriptionSQL, id, in.URL, in.Description, eventTypes, deref(in.Topic), in.Topic != nil))
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
		if _, err := scanSubscription(tx.QueryRow(ctx, getSubscriptionSQL, id)); err != nil {
			return notFound("subscription", id, err)
		}
		if _, err := tx.Exec(ctx, pruneExpiredSecretsSQL, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, expireCurrentSecretsSQL, id, s.SecretGrace); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insertSecretSQL, id, secret)
		return err
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
	if reason == "" {
		reason = "disabled by an operator"
	}
	sub, err := scanSubscription(s.db.QueryRow(ctx, disableSubscriptionSQL, id, reason))
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
	sub, err := scanSubscription(s.db.QueryRow(ctx, enableSubscriptionSQL, id))
	if err != nil {
		return nil, notFound("subscription", id, err)
	}
	return sub, nil
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

func scanSubscription(row pgx.Row) (*Subscription, error) {
	var s Subscription
	err := row.Scan(&s.ID, &s.URL, &s.Description, &s.EventTypes, &s.Topic, &s.Enabled,
		&s.DisabledReason, &s.DisabledAt, &s.ConsecutiveFailures, &s.CreatedAt, &s.UpdatedAt)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// notFound translates pgx.ErrNoRows into ErrNotFound, in one place.
func notFound(what, id string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s %s: %w", what, id, ErrNotFound)
	}
	return fmt.Errorf("read %s %s: %w", what, id, err)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
