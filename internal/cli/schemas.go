package cli

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/config"
	"github.com/outboxbridge/bridge/outbox/schema"
)

func init() { register(newSchemasCmd) }

func newSchemasCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "schemas",
		GroupID: groupSetup,
		Short:   "Schema-governed topics: register, list and show schemas in the registry (SCHEMA_REGISTRY_URL)",
		Long: `A topic is governed when the schema registry at SCHEMA_REGISTRY_URL (its
Confluent-compatible API) has a subject "<topic>-value". The relay then
validates each event of the topic against the latest version and writes it
with the Confluent wire format (magic byte 0, 4-byte schema id, the JSON); an
event that does not validate is parked as FAILED at its first try.
outbox.Enqueue refuses it up front when the application sets outbox.Schemas.

The registry enforces the subject's compatibility level: an incompatible
schema is refused with the registry's own reason.`,
		Example: `  bridge schemas register orders --file order.schema.json --compatibility BACKWARD
  bridge schemas list
  bridge schemas show orders -o json`,
	}
	c.AddCommand(newSchemasRegisterCmd(), newSchemasListCmd(), newSchemasShowCmd())
	return c
}

// schemaRegistry is the registry a schemas command talks to.
func schemaRegistry() (*schema.Registry, error) {
	cfg, err := loadConfig(config.Needs{})
	if err != nil {
		return nil, err
	}
	if cfg.Schemas.URL == "" {
		return nil, &config.Error{Var: "SCHEMA_REGISTRY_URL", Problem: "is required by bridge schemas (the registry's Confluent-compatible API, e.g. http://127.0.0.1:8081/apis/ccompat/v7)"}
	}
	return schema.New(schema.Config{URL: cfg.Schemas.URL, RefreshInterval: cfg.Schemas.Refresh})
}

func newSchemasRegisterCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "register TOPIC --file FILE [--type JSON] [--compatibility LEVEL]",
		Short: "Register a schema as the next version of TOPIC's subject",
		Long: `Registers the schema in FILE ("-" for standard input) as the next version of
the subject "<TOPIC>-value". --compatibility sets the subject's level first
(BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL,
FULL_TRANSITIVE, NONE). The relay and outbox.Enqueue use the new version
within SCHEMA_REGISTRY_REFRESH, without a restart.`,
		Example: `  bridge schemas register orders --file order.schema.json --compatibility BACKWARD
  cat order.schema.json | bridge schemas register orders --file - -o json`,
		Args: cobra.ExactArgs(1),
	}
	file := c.Flags().String("file", "", "the schema document (- for standard input)")
	typ := c.Flags().String("type", "JSON", "schema type: JSON or AVRO (validated by the bridge; AVRO payloads are written as Avro binary), PROTOBUF (registered only)")
	compat := c.Flags().String("compatibility", "", "set the subject's compatibility level first")
	runWithOutput(c, func(cmd *cobra.Command, args []string, out string) error {
		if *file == "" {
			return UsageErrorf("--file is required")
		}
		st, err := schema.SchemaType(*typ)
		if err != nil {
			return UsageErrorf("--type: %v", err)
		}
		var text []byte
		if *file == "-" {
			text, err = io.ReadAll(cmd.InOrStdin())
		} else {
			text, err = os.ReadFile(*file)
		}
		if err != nil {
			return fmt.Errorf("read the schema: %w", err)
		}
		reg, err := schemaRegistry()
		if err != nil {
			return err
		}
		ss, err := reg.Register(cmd.Context(), args[0], st, string(text), *compat)
		if err != nil {
			return err
		}
		if out == "json" {
			return printJSON(cmd.OutOrStdout(), schema.VersionOf(args[0], ss))
		}
		fmt.Fprintf(cmd.OutOrStdout(), "registered %s version %d (schema id %d)\n", ss.Subject, ss.Version, ss.ID)
		return nil
	})
	return c
}

func newSchemasListCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "list",
		Short:   "List the governed topics and their latest schema version",
		Example: "  bridge schemas list\n  bridge schemas list -o json",
		Args:    cobra.NoArgs,
	}
	runWithOutput(c, func(cmd *cobra.Command, _ []string, out string) error {
		reg, err := schemaRegistry()
		if err != nil {
			return err
		}
		items, err := reg.List(cmd.Context())
		if err != nil {
			return err
		}
		if out == "json" {
			return printList(cmd.OutOrStdout(), items, "")
		}
		rows := make([][]string, 0, len(items))
		for _, it := range items {
			rows = append(rows, []string{it.Topic, it.Subject, strconv.Itoa(it.Version), strconv.Itoa(it.ID), it.Type})
		}
		return printTable(cmd.OutOrStdout(), []string{"TOPIC", "SUBJECT", "VERSION", "ID", "TYPE"}, rows)
	})
	return c
}

func newSchemasShowCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "show TOPIC",
		Short:   "Show every registered version of TOPIC's schema",
		Example: "  bridge schemas show orders\n  bridge schemas show orders -o json",
		Args:    cobra.ExactArgs(1),
	}
	runWithOutput(c, func(cmd *cobra.Command, args []string, out string) error {
		reg, err := schemaRegistry()
		if err != nil {
			return err
		}
		items, err := reg.History(cmd.Context(), args[0])
		if err != nil {
			return err
		}
		if out == "json" {
			return printList(cmd.OutOrStdout(), items, "")
		}
		for _, it := range items {
			fmt.Fprintf(cmd.OutOrStdout(), "%s version %d (id %d, %s):\n%s\n\n", it.Subject, it.Version, it.ID, it.Type, termSafe(it.Schema))
		}
		return nil
	})
	return c
}
