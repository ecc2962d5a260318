package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

func init() { register(newDeliveriesCmd) }

func newDeliveriesCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "deliveries",
		Aliases: []string{"delivery"},
		GroupID: groupOperate,
		Short:   "The delivery log: list, attempts, show, revive and recover dead deliveries",
		Long: `Every webhook delivery and each of its HTTP attempts (time, duration, status,
error, first 1 KiB of the response). The log never shows payloads; only
'show ID --payload' does, on purpose.`,
		Example: `  bridge deliveries list --subscription 3f0c6a52-… --status dead
  bridge deliveries attempts 1234
  bridge deliveries revive --subscription 3f0c6a52-… --dead
  bridge deliveries recover --subscription 3f0c6a52-… --since 2026-03-01T02:10:00Z --until 2026-03-01T04:40:00Z`,
	}
	c.AddCommand(newDeliveriesListCmd(), newDeliveriesAttemptsCmd(), newDeliveriesShowCmd(), newDeliveriesReviveCmd(),
		newDeliveriesRecoverCmd())
	return c
}

func newDeliveriesListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "list [--subscription ID] [--status S] [--asset A] [--limit N] [--cursor CURSOR]",
		Short: "List deliveries, newest first, a page at a time (never payloads)",
		Example: `  bridge deliveries list --status dead
  bridge deliveries list --subscription 3f0c6a52-… --asset order-42 -o json
  bridge deliveries list --asset ''          # the null-asset stream
  bridge deliveries list --status dead --cursor 10234   # next page (the command is printed by the previous one)`,
		Args: cobra.NoArgs,
	}
	sub := c.Flags().String("subscription", "", "only this subscription")
	status := c.Flags().String("status", "", "pending, delivering, delivered or dead")
	asset := c.Flags().String("asset", "", "only this asset ('' with the flag given: the null asset)")
	limit := c.Flags().Int("limit", 50, "rows per page (1-1000)")
	cursor := c.Flags().String("cursor", "", "next_cursor of the previous page (the API's name for it)")
	// --after was this flag's first name; kept so scripts keep working.
	after := c.Flags().String("after", "", "cursor from the previous page")
	_ = c.Flags().MarkDeprecated("after", "use --cursor")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if *cursor == "" {
			cursor = after
		}
		p := store.ListParams{SubscriptionID: *sub, Status: *status, Limit: *limit, After: *cursor}
		if cmd.Flags().Changed("asset") {
			p.AssetID = asset
		}
		return withWebhookDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) error {
			page, err := store.NewDeliveryStore(pool).List(cmd.Context(), p)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out == "json" {
				return printList(w, page.Deliveries, page.NextCursor)
			}
			rows := make([][]string, len(page.Deliveries))
			for i, d := range page.Deliveries {
				rows[i] = []string{strconv.FormatInt(d.ID, 10), d.SubscriptionID, d.EventType, assetText(d.AssetID),
					int64Text(d.AssetSeq), d.Status, strconv.Itoa(d.Attempts), intText(d.LastStatusCode),
					nextText(d), oneLineCut(d.LastError, 60)}
			}
			if err := printTable(w, []string{"ID", "SUBSCRIPTION", "TYPE", "ASSET", "ASSET SEQ", "STATUS", "ATTEMPTS", "LAST STATUS", "NEXT", "LAST ERROR"}, rows); err != nil {
				return err
			}
			if page.NextCursor != "" {
				// The whole command, filters included: the next page of
				// "--status dead" is not the next page of everything.
				next := []string{"bridge", "deliveries", "list"}
				for _, f := range []string{"subscription", "status", "asset", "limit"} {
					if cmd.Flags().Changed(f) {
						next = append(next, "--"+f, shellQuote(cmd.Flags().Lookup(f).Value.String()))
					}
				}
				next = append(next, "--cursor", page.NextCursor)
				fmt.Fprintf(w, "\nmore: %s\n", strings.Join(next, " "))
			}
			return nil
		})
	})
	return c
}

// shellQuote quotes s for a POSIX shell when it needs it (an empty s becomes
// two single quotes).
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func parseDeliveryID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, UsageErrorf("delivery id %q is not a positive integer", s)
	}
	return id, nil
}

func newDeliveriesAttemptsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "attempts ID",
		Short:   "Every HTTP attempt of a delivery: time, duration, status, error, first 1 KiB of the response",
		Example: `  bridge deliveries attempts 1234 -o json`,
		Args:    cobra.ExactArgs(1),
	}
	runWithOutput(c, func(cmd *cobra.Command, args []string, out string) error {
		id, err := parseDeliveryID(args[0])
		if err != nil {
			return err
		}
		return withWebhookDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) error {
			as, err := store.NewDeliveryStore(pool).Attempts(cmd.Context(), id)
			if err != nil {
				return err
			}
			if out == "json" {
				return printList(cmd.OutOrStdout(), as, "")
			}
			rows := make([][]string, len(as))
			for i, a := range as {
				rows[i] = []string{strconv.Itoa(a.Attempt), a.StartedAt.UTC().Format(time.RFC3339Nano),
					(time.Duration(a.DurationMS * float64(time.Millisecond))).Round(time.Microsecond).String(),
					intText(a.StatusCode), oneLineCut(a.Error, 80), oneLineCut(a.ResponseBody, 80)}
			}
			return printTable(cmd.OutOrStdout(), []string{"ATTEMPT", "STARTED", "DURATION", "STATUS", "ERROR", "RESPONSE"}, rows)
		})
	})
	return c
}

func newDeliveriesShowCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "show ID [--payload]",
		Short: "Show one delivery; its payload only with --payload",
		Example: `  bridge deliveries show 1234
  bridge deliveries show 1234 --payload -o json`,
		Args: cobra.ExactArgs(1),
	}
	withPayload := c.Flags().Bool("payload", false, "also print the payload (the one deliberate way to read it)")
	runWithOutput(c, func(cmd *cobra.Command, args []string, out string) error {
		id, err := parseDeliveryID(args[0])
		if err != nil {
			return err
		}
		return withWebhookDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) error {
			store := store.NewDeliveryStore(pool)
			d, err := store.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			var payload []byte
			if *withPayload {
				if payload, err = store.Payload(cmd.Context(), id); err != nil {
					return err
				}
			}
			return printDelivery(cmd.OutOrStdout(), out, d, payload)
		})
	})
	return c
}

func printDelivery(w io.Writer, format string, d *store.Delivery, payload []byte) error {
	if format == "json" {
		v := struct {
			*store.Delivery
			Payload *rawJSON `json:"payload,omitempty"`
		}{Delivery: d}
		if payload != nil {
			p := rawJSON(payload)
			v.Payload = &p
		}
		return printJSON(w, v)
	}
	rows := [][]string{
		{"id", strconv.FormatInt(d.ID, 10)},
		{"seq", strconv.FormatInt(d.Seq, 10)},
		{"subscription", d.SubscriptionID},
		{"event id", d.EventID},
		{"event type", d.EventType},
		{"topic", d.Topic},
		{"asset", assetText(d.AssetID)},
		{"asset seq", int64Text(d.AssetSeq)},
		{"status", d.Status},
		{"attempts", strconv.Itoa(d.Attempts)},
		{"next attempt", nextText(*d)},
		{"last status", intText(d.LastStatusCode)},
		{"last error", orDash(d.LastError)},
		{"created", d.CreatedAt.UTC().Format(time.RFC3339Nano)},
		{"event created", d.EventCreatedAt.UTC().Format(time.RFC3339Nano)},
		{"delivered", timeText(d.DeliveredAt)},
		{"dead", timeText(d.DeadAt)},
		{"revived", timeText(d.RevivedAt)},
	}
	if d.ClaimedBy != "" {
		rows = append(rows, []string{"claimed by", d.ClaimedBy}, []string{"lease expires", timeText(d.LeaseExpiresAt)})
	}
	if err := printTable(w, []string{"FIELD", "VALUE"}, rows); err != nil {
		return err
	}
	if payload != nil {
		fmt.Fprintf(w, "\npayload:\n%s\n", payload)
	}
	return nil
}

// rawJSON prints stored JSON as JSON, not as a base64 string.
type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }

func newDeliveriesReviveCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "revive ID... | --subscription ID --dead",
		Short: "Put dead deliveries back to pending with attempts reset; they go out in their original order",
		Example: `  bridge deliveries revive 1234 1240
  bridge deliveries revive --subscription 3f0c6a52-… --dead`,
	}
	sub := c.Flags().String("subscription", "", "revive this subscription's dead deliveries (with --dead)")
	dead := c.Flags().Bool("dead", false, "with --subscription: every dead delivery of it")
	runWithOutput(c, func(cmd *cobra.Command, args []string, out string) error {
		bySub := cmd.Flags().Changed("subscription")
		switch {
		case bySub && len(args) > 0:
			return UsageErrorf("give delivery ids or --subscription ID --dead, not both")
		case bySub && !*dead:
			return UsageErrorf("--subscription needs --dead (revive every dead delivery of the subscription)")
		case !bySub && *dead:
			return UsageErrorf("--dead needs --subscription ID")
		case !bySub && len(args) == 0:
			return UsageErrorf("give delivery ids, or --subscription ID --dead")
		}
		var ids []int64
		for _, a := range args {
			id, err := parseDeliveryID(a)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		if bySub {
			if _, err := store.ParseID(*sub); err != nil {
				return usageError{err}
			}
		}
		return withWebhookDB(cmd.Context(), func(cfg *config.Config, pool *pgxpool.Pool) error {
			deliveries := store.NewDeliveryStore(pool)
			var revived []int64
			var notRevived []store.NotRevived
			var err error
			if bySub {
				if _, err := subscriptionStore(cfg, pool).Get(cmd.Context(), *sub); err != nil {
					return err
				}
				revived, err = deliveries.ReviveSubscription(cmd.Context(), *sub)
			} else {
				revived, notRevived, err = deliveries.Revive(cmd.Context(), ids)
			}
			if err != nil {
				return err
			}
			if revived == nil {
				revived = []int64{}
			}
			w := cmd.OutOrStdout()
			if out == "json" {
				v := map[string]any{"revived": revived}
				if len(notRevived) > 0 {
					v["not_revived"] = notRevived
				}
				if err := printJSON(w, v); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(w, "revived %d dead deliveries", len(revived))
				if len(revived) > 0 && len(revived) <= 20 {
					parts := make([]string, len(revived))
					for i, id := range revived {
						parts[i] = strconv.FormatInt(id, 10)
					}
					fmt.Fprintf(w, ": %s", strings.Join(parts, " "))
				}
				fmt.Fprintln(w)
				for _, n := range notRevived {
					fmt.Fprintf(w, "not revived: %d %s\n", n.ID, n.Reason)
				}
				if len(revived) > 0 {
					fmt.Fprintln(w, "they are delivered in their original order once their subscription is enabled")
				}
			}
			if !bySub && len(revived) == 0 {
				// Asked for ids and nothing happened: not a success.
				return noneActed("revived", len(notRevived), anyNotFound(notRevived))
			}
			return nil
		})
	})
	return c
}

func assetText(a *string) string {
	if a == nil {
		return "(null)"
	}
	return *a
}

func int64Text(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}

func intText(n *int) string {
	if n == nil {
		return "-"
	}
	return strconv.Itoa(*n)
}

func timeText(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func nextText(d store.Delivery) string {
	if d.Status != store.StatusPending {
		return "-"
	}
	if wait := time.Until(d.NextAttemptAt); wait > 0 {
		return "in " + wait.Round(time.Second).String()
	}
	return "due"
}

func oneLineCut(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}
