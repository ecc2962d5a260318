package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

func init() { register(newSubscriptionsCmd) }

// webhookError makes bad input and unknown ids exit 2, with the message
// naming the field or the id.
func webhookError(err error) error {
	var ve *store.ValidationError
	if errors.As(err, &ve) || errors.Is(err, store.ErrNotFound) {
		return usageError{err}
	}
	return err
}

// withWebhookDB is withDB for the webhook commands: their validation errors
// and unknown ids exit 2.
func withWebhookDB(ctx context.Context, f func(cfg *config.Config, pool *pgxpool.Pool) error) error {
	return webhookError(withDB(ctx, f))
}

// withSecretsDB is withWebhookDB for the commands that write a signing
// secret: without BRIDGE_SECRET_KEYS (or BRIDGE_ALLOW_PLAINTEXT_SECRETS)
// they exit 2 before connecting, instead of storing the secret in plain text.
func withSecretsDB(ctx context.Context, f func(cfg *config.Config, pool *pgxpool.Pool) error) error {
	return webhookError(withDBNeeds(ctx, config.Needs{Database: true, Secrets: true}, f))
}

// subscriptionStore is the store every subscription command uses: it seals
// the secrets it writes under BRIDGE_SECRET_KEYS.
func subscriptionStore(cfg *config.Config, pool *pgxpool.Pool) *store.SubscriptionStore {
	s := store.NewSubscriptionStore(pool, cfg.Webhook.AllowHTTP, cfg.Webhook.SecretGrace).WithKeys(cfg.Secrets.Ring())
	// config.Load has parsed WEBHOOK_ALLOWED_CIDRS already: no error here.
	allowed, _ := cfg.Webhook.ParsedAllowedCIDRs()
	s.WithAllowedCIDRs(allowed)
	s.Operations = cfg.Operations.Topic
	return s
}

func newSubscriptionsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "subscriptions",
		Aliases: []string{"subscription", "subs"},
		GroupID: groupOperate,
		Short:   "Manage webhook subscriptions: endpoints, event types, signing secrets",
		Long: `A subscription is an endpoint URL and the event types it receives (exact
names, "prefix.*" wildcards, or "*"), optionally only from one topic. Each
request is signed per Standard Webhooks with the subscription's secret
("whsec_…"), shown once by create and rotate-secret.

URLs must be https unless WEBHOOK_ALLOW_HTTP=true. Where a URL points is
checked on every attempt, at connect time (see docs/webhooks.md, SSRF).`,
		Example: `  bridge subscriptions create --url https://crm.example.com/hooks --event-types 'asset.*,order.paid'
  bridge subscriptions list -o json
  bridge subscriptions rotate-secret 3f0c…`,
	}
	c.AddCommand(newSubCreateCmd(), newSubListCmd(), newSubShowCmd(), newSubUpdateCmd(), newSubRotateCmd(),
		newSubDisableCmd(), newSubEnableCmd(), newSubDeleteCmd())
	return c
}

func newSubCreateCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "create --url URL --event-types T[,T...] [--topic T] [--description D] [--since T] [--rate-limit N [--rate-burst B]]",
		Short: "Create a subscription; prints its signing secret (the only time it is shown)",
		Example: `  bridge subscriptions create --url https://crm.example.com/hooks --event-types 'asset.*'
  bridge subscriptions create --url https://billing.example.com/in --event-types order.paid,order.refunded --topic orders -o json
  bridge subscriptions create --url https://search.example.com/in --event-types 'asset.*' --since 6h   # history first (as far back as RELAY_RETENTION)
  bridge subscriptions create --url https://small.example.com/in --event-types '*' --rate-limit 50   # at most 50 requests/s, all deliverers together`,
		Args: cobra.NoArgs,
	}
	url := c.Flags().String("url", "", "endpoint URL (https; http only with WEBHOOK_ALLOW_HTTP=true)")
	types := c.Flags().StringSlice("event-types", nil, "comma-separated event types: exact names, prefix.* or *")
	topic := c.Flags().String("topic", "", "only events from this topic (default: any topic)")
	desc := c.Flags().String("description", "", "free text for operators")
	since := c.Flags().String("since", "", "start with every retained matching event since this RFC 3339 time or duration ago (e.g. 6h), then the live ones")
	rate := addRateFlags(c)
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		in := store.SubscriptionInput{EventTypes: trimAll(*types), Description: desc, Topic: topic}
		if err := rate.set(cmd, &in); err != nil {
			return err
		}
		if cmd.Flags().Changed("since") {
			t, err := store.ParseSince(*since, time.Now())
			if err != nil {
				return UsageErrorf("--%s", err)
			}
			in.Since = &t
		}
		if cmd.Flags().Changed("url") {
			in.URL = url
		}
		if in.URL == nil {
			return UsageErrorf("--url is required")
		}
		if !cmd.Flags().Changed("event-types") {
			return UsageErrorf("--event-types is required (exact names, prefix.* or *)")
		}
		return withSecretsDB(cmd.Context(), func(cfg *config.Config, pool *pgxpool.Pool) error {
			if in.Since != nil {
				// With the fast lane on the history is read from the
				// topics: refuse one that reaches past their retention.
				src, err := recoverSource(cfg)
				if err != nil {
					return err
				}
				topic := ""
				if in.Topic != nil {
					topic = *in.Topic
				}
				if src != nil {
					if err := src.CheckSince(cmd.Context(), topic, *in.Since); err != nil {
						var re *kafkawindow.RetentionError
						if errors.As(err, &re) {
							return usageError{fmt.Errorf("--since: %w", err)}
						}
						return err
					}
				}
			}
			sub, err := subscriptionStore(cfg, pool).Create(cmd.Context(), in)
			if err != nil {
				return err
			}
			return printSubscription(cmd.OutOrStdout(), out, sub)
		})
	})
	return c
}

func newSubListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "list",
		Short:   "List subscriptions (never their secrets)",
		Example: `  bridge subscriptions list -o json`,
		Args:    cobra.NoArgs,
	}
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		return withWebhookDB(cmd.Context(), func(cfg *config.Config, pool *pgxpool.Pool) error {
			subs, err := subscriptionStore(cfg, pool).List(cmd.Context())
			if err != nil {
				return err
			}
			if out == "json" {
				return printList(cmd.OutOrStdout(), subs, "")
			}
			rows := make([][]string, len(subs))
			for i, s := range subs {
				state := "enabled"
				if !s.Enabled {
					state = "disabled"
				}
				rows[i] = []string{s.ID, s.URL, strings.Join(s.EventTypes, ","), orDash(s.Topic), state,
					strconv.Itoa(s.ConsecutiveFailures), rateText(&s), s.Description}
			}
			return printTable(cmd.OutOrStdout(), []string{"ID", "URL", "EVENT TYPES", "TOPIC", "STATE", "DEAD IN A ROW", "RATE LIMIT", "DESCRIPTION"}, rows)
		})
	})
	return c
}

// subIDCmd builds the commands that take one subscription ID.
func subIDCmd(use, short, example string, run func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error)) (*cobra.Command, *string) {
	return subIDCmdWith(withWebhookDB, use, short, example, run)
}

// subIDCmdWith is subIDCmd connecting through with (withSecretsDB for a
// command that writes a secret).
func subIDCmdWith(with func(context.Context, func(*config.Config, *pgxpool.Pool) error) error, use, short, example string,
	run func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error)) (*cobra.Command, *string) {
	c := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.ExactArgs(1),
	}
	format := runWithOutput(c, func(cmd *cobra.Command, args []string, out string) error {
		if _, err := store.ParseID(args[0]); err != nil {
			return usageError{err}
		}
		return with(cmd.Context(), func(cfg *config.Config, pool *pgxpool.Pool) error {
			sub, err := run(cmd, subscriptionStore(cfg, pool), args[0])
			if err != nil {
				return err
			}
			if sub == nil {
				return nil
			}
			return printSubscription(cmd.OutOrStdout(), out, sub)
		})
	})
	return c, format
}

func newSubShowCmd() *cobra.Command {
	c, _ := subIDCmd("show ID", "Show a subscription and its valid secrets (not their values)",
		`  bridge subscriptions show 3f0c6a52-…  -o json`,
		func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error) {
			return subs.Get(cmd.Context(), id)
		})
	return c
}

func newSubUpdateCmd() *cobra.Command {
	var url, topic, desc string
	var types []string
	var rate rateFlags
	c, _ := subIDCmd("update ID [--url URL] [--event-types T,...] [--topic T] [--description D] [--rate-limit N [--rate-burst B]]",
		"Change a subscription's URL, event types, topic filter, description or rate limit",
		`  bridge subscriptions update 3f0c6a52-… --event-types 'asset.*,order.*'
  bridge subscriptions update 3f0c6a52-… --topic ''   # any topic again
  bridge subscriptions update 3f0c6a52-… --rate-limit 20 --rate-burst 5
  bridge subscriptions update 3f0c6a52-… --rate-limit 0   # no limit again`,
		func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error) {
			var in store.SubscriptionInput
			f := cmd.Flags()
			if f.Changed("url") {
				in.URL = &url
			}
			if f.Changed("event-types") {
				in.EventTypes = trimAll(types)
				if in.EventTypes == nil {
					in.EventTypes = []string{}
				}
			}
			if f.Changed("topic") {
				in.Topic = &topic
			}
			if f.Changed("description") {
				in.Description = &desc
			}
			if err := rate.set(cmd, &in); err != nil {
				return nil, err
			}
			if !f.Changed("url") && !f.Changed("event-types") && !f.Changed("topic") && !f.Changed("description") && in.RateLimit == nil {
				return nil, UsageErrorf("nothing to update: give --url, --event-types, --topic, --description or --rate-limit")
			}
			return subs.Update(cmd.Context(), id, in)
		})
	c.Flags().StringVar(&url, "url", "", "new endpoint URL")
	c.Flags().StringSliceVar(&types, "event-types", nil, "new event types (replaces the list)")
	c.Flags().StringVar(&topic, "topic", "", "new topic filter; empty: any topic")
	c.Flags().StringVar(&desc, "description", "", "new description")
	rate = *addRateFlags(c)
	return c
}

// rateFlags are --rate-limit and --rate-burst, the same on create and update.
type rateFlags struct{ limit, burst *int }

func addRateFlags(c *cobra.Command) *rateFlags {
	return &rateFlags{
		limit: c.Flags().Int("rate-limit", 0, "at most this many requests per second, all deliverers together; 0: no limit"),
		burst: c.Flags().Int("rate-burst", 0, "with --rate-limit: how many may start at once (default: a tenth of the limit, at least 1)"),
	}
}

// set puts the flags given into in, checked by the store's rule (exit 2
// naming the flag).
func (r *rateFlags) set(cmd *cobra.Command, in *store.SubscriptionInput) error {
	if cmd.Flags().Changed("rate-limit") {
		in.RateLimit = r.limit
	}
	if cmd.Flags().Changed("rate-burst") {
		in.RateBurst = r.burst
	}
	if err := in.CheckRate(); err != nil {
		return UsageErrorf("--%s", err)
	}
	return nil
}

func newSubRotateCmd() *cobra.Command {
	c, _ := subIDCmdWith(withSecretsDB, "rotate-secret ID",
		"Create a new signing secret; the previous one keeps signing for WEBHOOK_SECRET_GRACE",
		`  bridge subscriptions rotate-secret 3f0c6a52-…
  WEBHOOK_SECRET_GRACE=1h bridge subscriptions rotate-secret 3f0c6a52-… -o json`,
		func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error) {
			return subs.RotateSecret(cmd.Context(), id)
		})
	return c
}

func newSubDisableCmd() *cobra.Command {
	var reason string
	c, _ := subIDCmd("disable ID [--reason TEXT]", "Stop delivering to a subscription (its deliveries wait, pending)",
		`  bridge subscriptions disable 3f0c6a52-… --reason "endpoint migration"`,
		func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error) {
			return subs.Disable(cmd.Context(), id, reason)
		})
	c.Flags().StringVar(&reason, "reason", "", "why (shown by show and list)")
	return c
}

func newSubEnableCmd() *cobra.Command {
	c, _ := subIDCmd("enable ID", "Resume delivering to a subscription and reset its failure count",
		`  bridge subscriptions enable 3f0c6a52-…
  bridge deliveries revive --subscription 3f0c6a52-… --dead   # then retry what died`,
		func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error) {
			return subs.Enable(cmd.Context(), id)
		})
	return c
}

func newSubDeleteCmd() *cobra.Command {
	var out *string
	var c *cobra.Command
	c, out = subIDCmd("delete ID", "Delete a subscription with its secrets, deliveries and attempt log",
		`  bridge subscriptions delete 3f0c6a52-…`,
		func(cmd *cobra.Command, subs *store.SubscriptionStore, id string) (*store.Subscription, error) {
			if err := subs.Delete(cmd.Context(), id); err != nil {
				return nil, err
			}
			id, _ = store.ParseID(id)
			if *out == "json" {
				return nil, printJSON(cmd.OutOrStdout(), map[string]any{"id": id, "deleted": true})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted subscription %s\n", id)
			return nil, nil
		})
	return c
}

func printSubscription(w io.Writer, format string, s *store.Subscription) error {
	if format == "json" {
		return printJSON(w, s)
	}
	state := "enabled"
	if !s.Enabled {
		state = "disabled"
		if s.DisabledReason != "" {
			state += ": " + s.DisabledReason
		}
		if s.DisabledAt != nil {
			state += " (since " + s.DisabledAt.UTC().Format(time.RFC3339) + ")"
		}
	}
	rows := [][]string{
		{"id", s.ID},
		{"url", s.URL},
		{"event types", strings.Join(s.EventTypes, ",")},
		{"topic", orDash(s.Topic)},
		{"description", orDash(s.Description)},
		{"state", state},
		{"dead in a row", strconv.Itoa(s.ConsecutiveFailures)},
		{"rate limit", rateText(s)},
		{"created", s.CreatedAt.UTC().Format(time.RFC3339)},
	}
	if h := s.History; h != nil {
		v := fmt.Sprintf("since %s: %d deliveries copied, ", h.Since.UTC().Format(time.RFC3339), h.Copied)
		if h.DoneAt != nil {
			v += "done " + h.DoneAt.UTC().Format(time.RFC3339)
		} else {
			v += "still copying (its deliveries wait until it is done)"
		}
		rows = append(rows, []string{"history", v})
	}
	for _, sec := range s.Secrets {
		v := "current, since " + sec.CreatedAt.UTC().Format(time.RFC3339)
		if sec.ExpiresAt != nil {
			v = "previous, signs until " + sec.ExpiresAt.UTC().Format(time.RFC3339)
		}
		rows = append(rows, []string{"secret #" + strconv.FormatInt(sec.ID, 10), v})
	}
	if s.Secret != "" {
		rows = append(rows, []string{"secret", s.Secret})
	}
	if err := printTable(w, []string{"FIELD", "VALUE"}, rows); err != nil {
		return err
	}
	if s.Secret != "" {
		fmt.Fprintln(w, "\nStore the secret now: it is not shown again. Verify requests with it (docs/webhooks.md).")
	}
	return nil
}

// rateText is a subscription's rate limit as list and show print it.
func rateText(s *store.Subscription) string {
	if s.RateLimit == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/s (burst %d)", s.RateLimit, s.RateBurst)
}

func trimAll(xs []string) []string {
	var out []string
	for _, x := range xs {
		out = append(out, strings.TrimSpace(x))
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
