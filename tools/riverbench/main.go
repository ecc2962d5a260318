// Command riverbench is the anchor of `bridge bench deliver`: how many no-op
// jobs a second River burns down on the same PostgreSQL, in a scratch
// database next to DATABASE_URL's (dropped afterwards). Run it back to back
// with the bench; it prints one JSON object.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	done *atomic.Int64
}

func (w *noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	w.done.Add(1)
	return nil
}

type result struct {
	Jobs          int     `json:"jobs"`
	Workers       int     `json:"workers"`
	InsertSeconds float64 `json:"insert_seconds"`
	DrainSeconds  float64 `json:"drain_seconds"`
	JobsPerSecond float64 `json:"jobs_per_second"`
	River         string  `json:"river"`
}

func main() {
	jobs := flag.Int("jobs", 100000, "no-op jobs inserted before the workers start")
	workers := flag.Int("workers", 10000, "River MaxWorkers of the default queue (River's own benchmark runs 10,000)")
	flag.Parse()
	if err := run(*jobs, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "riverbench:", err)
		os.Exit(1)
	}
}

func run(jobs, workers int) error {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return fmt.Errorf("DATABASE_URL is required")
	}
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("riverbench_%d", os.Getpid())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("create scratch database: %w", err)
	}
	defer admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") //nolint:errcheck
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	u.Path = "/" + name
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return err
	}
	pcfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate river: %w", err)
	}
	var done atomic.Int64
	ws := river.NewWorkers()
	river.AddWorker(ws, &noopWorker{done: &done})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers: ws,
	})
	if err != nil {
		return err
	}
	start := time.Now()
	for from := 0; from < jobs; from += 10000 {
		n := min(10000, jobs-from)
		params := make([]river.InsertManyParams, n)
		for i := range params {
			params[i] = river.InsertManyParams{Args: noopArgs{}}
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("insert jobs: %w", err)
		}
	}
	res := result{Jobs: jobs, Workers: workers, InsertSeconds: time.Since(start).Seconds(), River: "v0.51.2"}
	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	for done.Load() < int64(jobs) {
		time.Sleep(5 * time.Millisecond)
	}
	res.DrainSeconds = time.Since(start).Seconds()
	res.JobsPerSecond = float64(jobs) / res.DrainSeconds
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = client.Stop(stopCtx)
	return json.NewEncoder(os.Stdout).Encode(res)
}
