// Package console is the operator console: server-rendered pages under
// /ui/ on the ops server (HTTP_ADDR), next to the admin API and with the
// same token (ADMIN_TOKEN), for what an operator does when a subscriber
// calls at 3 a.m.: see the pipeline (Overview), find and replay parked
// outbox rows and see the NEW and SENT ones (Outbox), manage endpoints
// (Subscriptions), find, revive and recover dead deliveries (Deliveries),
// read one event's trace (Trace), find anything by its id (Search), and see
// who did what (Audit log). docs/console.md describes every page and the
// exact scope of every action.
//
// Shape: Go html/template pages with htmx (vendored, pinned:
// static/htmx-2.0.8.min.js) for the parts that update themselves. Every
// action is a plain HTML form, so the console works without JavaScript
// except for live updates and the copy button; everything is embedded, so
// there is nothing to deploy and nothing fetched at run time.
//
// The console calls the same store functions as the admin API handlers
// (internal/outboxstore, internal/delivery/store) and has no SQL of its own;
// it reads deliveries through DeliveryReader only, so it shows a delivery
// the same whichever lane carried it. Every action is a POST answered by a
// redirect (Post/Redirect/Get: a reload repeats nothing) and is written to
// the audit log (internal/audit). Links with a query are built from
// url.Values by one helper (link/href), never by pasting an encoded query
// into a template, where html/template would escape it again and drop the
// filter.
//
// Security: the token is exchanged once for a session cookie (HttpOnly,
// SameSite=Strict, Secure over TLS, expiring); a wrong token is logged and
// counted by the admin API's Authenticator. Every POST carries the
// session's CSRF token. Pages are served with a Content-Security-Policy
// that allows no inline script and no other origin, and html/template
// escapes everything an application or a subscriber wrote (payloads,
// headers, errors, answer excerpts). A signing secret appears only on the
// page after create or rotate, handed to it through the session once
// (never in a URL or a flash message). Sessions live in the process: behind a load
// balancer with several replicas, use sticky sessions or sign in per
// replica.
package console
