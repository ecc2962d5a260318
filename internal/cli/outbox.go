package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/database/statement"
	"github.com/outboxbridge/bridge/internal/outboxstore"
)

func init() { register(newOutboxCmd) }

func newOutboxCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "outbox",
		GroupID: groupOperate,
		Short:   "Inspect the outbox: stats, FAILED rows, replay",
		Example: `  bridge outbox stats
  bridge outbox failed --topic assets
  bridge outbox replay --all-failed --topic assets --since 1h`,
	}
	c.AddCommand(newOutboxStatsCmd(), newOutboxFailedCmd(), newOutboxReplayCmd())
	return c
}

func newOutboxStatsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "stats",
		Short:   "Rows by status, age of the oldest NEW row, FAILED rows by topic",
		Example: `  bridge outbox stats -o json`,
		Args:    cobra.NoArgs,
	}
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		var st outboxstore.Stats
		err := withDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) (err error) {
			st, err = outboxstore.ReadStats(cmd.Context(), pool)
			return err
		})
		if err != nil {
			return err
		}
		if out == "json" {
			return printJSON(cmd.OutOrStdout(), st)
		}
		w := cmd.OutOrStdout()
		rows := [][]string{
			{"NEW", strconv.FormatInt(st.ByStatus["NEW"], 10)},
			{"SENT", strconv.FormatInt(st.ByStatus["SENT"], 10)},
			{"FAILED", strconv.FormatInt(st.ByStatus["FAILED"], 10)},
		}
		if err := printTable(w, []string{"STATUS", "ROWS"}, rows); err != nil {
			return err
		}
		fmt.Fprintf(w, "\noldest NEW row: %s\n", (time.Duration(st.OldestNewAgeSeconds * float64(time.Second))).Round(time.Millisecond))
		if len(st.FailedByTopic) > 0 {
			fmt.Fprintln(w)
			var fr [][]string
			for t, n := range st.FailedByTopic {
				fr = append(fr, []string{t, strconv.FormatInt(n, 10)})
			}
			return printTable(w, []string{"TOPIC", "FAILED"}, fr)
		}
		return nil
	})
	return c
}

// maxFailedPage bounds one page of `outbox failed`, as every listing's
// (deliveries list: 1000): a larger page is a query and an output nobody
// reads, and --cursor reaches the rest.
const maxFailedPage = 1000

func newOutboxFailedCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "failed [--topic T] [--limit N] [--cursor CURSOR]",
		Short: "List FAILED (parked) rows with attempts and last error, a page at a time",
		Example: `  bridge outbox failed --topic assets --limit 20
  bridge outbox failed --payload -o json
  bridge outbox failed --cursor 10234   # next page (the command is printed by the previous one)`,
		Args: cobra.NoArgs,
	}
	topic := c.Flags().String("topic", "", "only rows of this topic")
	limit := c.Flags().Int("limit", 100, fmt.Sprintf("rows per page (1-%d)", maxFailedPage))
	cursor := c.Flags().String("cursor", "", "next_cursor of the previous page")
	payload := c.Flags().Bool("payload", false, "include payloads (off by default: triage, not reading event contents)")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		if *limit < 1 || *limit > maxFailedPage {
			return UsageErrorf("--limit must be between 1 and %d, got %d", maxFailedPage, *limit)
		}
		var after int64
		if *cursor != "" {
			n, err := strconv.ParseInt(*cursor, 10, 64)
			if err != nil || n < 0 {
				return UsageErrorf("--cursor %q is not a cursor printed by a previous page", *cursor)
			}
			after = n
		}
		var rows []outboxstore.FailedRow
		err := withDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) (err error) {
			// One row more than the page says whether there is a next one.
			rows, err = outboxstore.ListFailed(cmd.Context(), pool, *topic, *limit+1, *payload, after)
			return err
		})
		if err != nil {
			return err
		}
		next := ""
		if len(rows) > *limit {
			rows = rows[:*limit]
			next = strconv.FormatInt(rows[len(rows)-1].Seq, 10)
		}
		if out == "json" {
			return printList(cmd.OutOrStdout(), rows, next)
		}
		table := make([][]string, 0, len(rows))
		for _, r := range rows {
			asset := "(null)"
			if r.AssetID != nil {
				asset = *r.AssetID
			}
			line := []string{r.ID.String(), r.Topic, asset, r.EventType, strconv.Itoa(r.Attempts), truncate(r.LastError, 80)}
			if *payload && r.Payload != nil {
				line = append(line, *r.Payload)
			}
			table = append(table, line)
		}
		header := []string{"ID", "TOPIC", "ASSET", "TYPE", "ATTEMPTS", "LAST ERROR"}
		if *payload {
			header = append(header, "PAYLOAD")
		}
		w := cmd.OutOrStdout()
		if err := printTable(w, header, table); err != nil {
			return err
		}
		if next != "" {
			line := []string{"bridge", "outbox", "failed"}
			for _, f := range []string{"topic", "limit", "payload"} {
				if cmd.Flags().Changed(f) {
					line = append(line, "--"+f+"="+shellQuote(cmd.Flags().Lookup(f).Value.String()))
				}
			}
			line = append(line, "--cursor", next)
			fmt.Fprintf(w, "\nmore: %s\n", strings.Join(line, " "))
		}
		return nil
	})
	return c
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func newOutboxReplayCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "replay (--id ID... | --all-failed [--topic T] [--since DURATION])",
		Short: "Return FAILED rows to NEW with attempts reset (after fixing the cause)",
		Example: `  bridge outbox replay --id 0b7c6a4e-5f0e-4f43-9d4c-2f3f0f6b8e11
  bridge outbox replay --all-failed --topic assets --since 2h`,
		Args: cobra.NoArgs,
	}
	ids := c.Flags().StringSlice("id", nil, "FAILED row id (repeatable or comma-separated)")
	all := c.Flags().Bool("all-failed", false, "replay every FAILED row (narrow with --topic/--since)")
	topic := c.Flags().String("topic", "", "with --all-failed: only this topic")
	since := c.Flags().Duration("since", 0, "with --all-failed: only rows that failed within this duration")
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		switch {
		case len(*ids) == 0 && !*all:
			return UsageErrorf("replay needs a selector: --id ID... or --all-failed")
		case len(*ids) > 0 && *all:
			return UsageErrorf("use either --id or --all-failed, not both")
		case len(*ids) > 0 && (*topic != "" || *since != 0):
			return UsageErrorf("--topic and --since only narrow --all-failed")
		case *since < 0:
			return UsageErrorf("--since must be positive")
		}
		parsed := make([]uuid.UUID, 0, len(*ids))
		for _, s := range *ids {
			id, err := uuid.Parse(s)
			if err != nil {
				return UsageErrorf("--id %q is not a UUID", s)
			}
			parsed = append(parsed, id)
		}
		var n int64
		var skipped []outboxstore.NotReplayed
		err := withDB(cmd.Context(), func(_ *config.Config, pool *pgxpool.Pool) (err error) {
			if *all {
				n, err = outboxstore.ReplayAllFailed(cmd.Context(), pool, *topic, *since)
			} else {
				var replayed []uuid.UUID
				replayed, skipped, err = outboxstore.ReplayIDs(cmd.Context(), pool, parsed)
				n = int64(len(replayed))
			}
			return err
		})
		if err != nil {
			return err
		}
		w := cmd.OutOrStdout()
		if out == "json" {
			v := struct {
				Replayed    int64                     `json:"replayed"`
				NotReplayed []outboxstore.NotReplayed `json:"not_replayed,omitempty"`
			}{n, skipped}
			if err := printJSON(w, v); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(w, "replayed %d row(s): FAILED → NEW, attempts reset\n", n)
			for _, s := range skipped {
				fmt.Fprintf(w, "not replayed: %s %s\n", s.ID, s.Reason)
			}
		}
		if !*all && n == 0 {
			// Asked for ids and nothing happened: a script must not read
			// that as success.
			return noneActed("replayed", len(skipped), anyNotFound(skipped))
		}
		return nil
	})
	return c
}

// noneActed is the error of an operator command given ids that did none of
// them: "not found" (an id naming nothing) exits 2, like every command
// given an unknown id (subscriptions show, deliveries show); ids that all
// exist but are in another state exit 1.
func noneActed(verb string, n int, notFound bool) error {
	if notFound {
		return UsageErrorf("none of the %d id(s) given was %s: not found (each is listed above with the reason)", n, verb)
	}
	return fmt.Errorf("none of the %d id(s) given was %s (each is listed above with the reason)", n, verb)
}

// anyNotFound reports whether an id left alone names nothing.
func anyNotFound[ID any](left []statement.LeftAlone[ID]) bool {
	for _, l := range left {
		if strings.HasPrefix(l.Reason, "no such") {
			return true
		}
	}
	return false
}
