// Package console is the operator console: server-rendered pages under
// /ui/ on the ops server (HTTP_ADDR), next to the admin API and with the
// same token (ADMIN_TOKEN), for what an operator does when a subscriber
// calls at 3 a.m.: see the pipeline (Overview), find and replay parked
// outbox rows (Outbox), manage endpoints (Subscriptions), find and revive
// dead deliveries (Deliveries), and read one event's trace (Trace).
//
// Shape: Go html/template pages with htmx (vendored, pinned:
// static/htmx-2.0.8.min.js) for the parts that update themselves. Every
// action is a plain HTML form, so the console works without JavaScript
// except for live updates and the copy button; everything is embedded, so
// there is nothing to deploy and nothing fetched at run time.
//
// The console calls the same store functions as the admin API handlers
// (internal/relay, internal/webhook) and has no SQL of its own.
//
// Security: the token is exchanged once for a session cookie (HttpOnly,
// SameSite=Strict, Secure over TLS, expiring); a wrong token is logged and
// counted by the admin API's Authenticator. Every POST carries the
// session's CSRF token. Pages are served with a Content-Security-Policy
// that allows no inline script and no other origin, and html/template
// escapes everything an application or a subscriber wrote (payloads,
// headers, errors, answer excerpts). Signing secrets appear only in the
// answer to create and rotate. Sessions live in the process: behind a load
// balancer with several replicas, use sticky sessions or sign in per
// replica.
package console
