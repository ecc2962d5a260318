package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/internal/delivery/kafkawindow"
	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// recoverSource is where recover reads a window from Kafka: nil unless the
// fast lane is on; then Kafka and CONSUMER_TOPICS must be set.
func recoverSource(cfg *config.Config) (*kafkawindow.Source, error) {
	if !cfg.Webhook.FastLane {
		return nil, nil
	}
	values, err := valueDecoder(cfg)
	if err != nil {
		return nil, err
	}
	return kafkawindow.SourceFromConfig(cfg, values, nil)
}

func newDeliveriesRecoverCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "recover --subscription ID --since T [--until T2]",
		Short: "Revive every dead delivery of a subscription created in a time window, oldest first",
		Long: `After an outage of the endpoint: every delivery of the subscription that died
and was created in [--since, --until) goes back to pending with its attempts
reset, exactly as 'revive' does; per asset they go out in their original
asset_seq order. T is an RFC 3339 time (2026-03-01T02:10:00Z) or a duration
meaning that long ago (3h). Without --until the window ends now.

With the fast lane on (WEBHOOK_FAST_LANE=true) a delivered event has no row,
so the window is also read from CONSUMER_TOPICS by time: every event of it
that matches the subscription and has no delivery row for it is queued
again, in partition order (so per asset in asset_seq order), behind what its
stream has pending. A window that starts before what a topic still holds
(its retention) is refused, naming the earliest time still available, and
nothing is written.`,
		Example: `  bridge deliveries recover --subscription 3f0c6a52-… --since 2026-03-01T02:10:00Z --until 2026-03-01T04:40:00Z
  bridge deliveries recover --subscription 3f0c6a52-… --since 6h`,
	}
	sub := c.Flags().String("subscription", "", "the subscription whose dead deliveries to revive (required)")
	since := c.Flags().String("since", "", "start of the window: RFC 3339 time or a duration before now (required)")
	until := c.Flags().String("until", "", "end of the window (exclusive): RFC 3339 time or a duration before now; default now")
	runWithOutput(c, func(cmd *cobra.Command, args []string, out string) error {
		if len(args) > 0 {
			return UsageErrorf("recover takes no arguments (got %q); use --subscription, --since, --until", args[0])
		}
		if *sub == "" {
			return UsageErrorf("--subscription is required")
		}
		if _, err := store.ParseID(*sub); err != nil {
			return usageError{fmt.Errorf("--subscription: %w", err)}
		}
		w, err := store.ParseWindow(*since, *until, time.Now())
		if err != nil {
			return usageError{fmt.Errorf("--%w", err)}
		}
		return withWebhookDB(cmd.Context(), func(cfg *config.Config, pool *pgxpool.Pool) error {
			s, err := subscriptionStore(cfg, pool).Get(cmd.Context(), *sub)
			if err != nil {
				return fmt.Errorf("--subscription: %w", err)
			}
			src, err := recoverSource(cfg)
			if err != nil {
				return err
			}
			rec, err := kafkawindow.RecoverWindow(cmd.Context(), pool, store.NewDeliveryStore(pool), src, s, w)
			var re *kafkawindow.RetentionError
			if errors.As(err, &re) {
				return usageError{fmt.Errorf("--since: %w", err)}
			}
			if err != nil {
				return err
			}
			ids := rec.IDs
			wr := cmd.OutOrStdout()
			if out == "json" {
				res := map[string]any{"recovered": len(ids), "ids": ids}
				if rec.Kafka != nil {
					res["queued_from_kafka"] = rec.Kafka.Queued
					res["read_from_kafka"] = rec.Kafka.Read
				}
				return printJSON(wr, res)
			}
			if rec.Kafka != nil {
				fmt.Fprintf(wr, "read %d records of the window from Kafka; queued %d events the subscription had no delivery of (in asset order, behind its pending ones)\n",
					rec.Kafka.Read, rec.Kafka.Queued)
			}
			if len(ids) == 0 {
				fmt.Fprintln(wr, "no dead deliveries of this subscription were created in the window; nothing revived")
				return nil
			}
			fmt.Fprintf(wr, "recovered %d dead deliveries (attempts reset); they go out oldest first, in asset_seq order per asset, once the subscription is enabled\n", len(ids))
			return nil
		})
	})
	return c
}
