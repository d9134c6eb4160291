// Package daemon is Mercator's composition root: it turns configuration
// (what `mercator server` and `mercator node` are started with) into running
// processes, choosing and opening the adapters the domain packages only see
// through interfaces: the store driver (package store/sqlstore, SQLite or
// PostgreSQL by URL), the replica coordinator (package replica), the content
// store for Artifacts (package content), the image resolver (package
// imageref), the admin credential file and the listener.
//
// Domain packages (controlplane and its subpackages, scheduler, lifecycle,
// api) never import a store driver or replica; this package is where they
// meet, as containerd registers its backends in plugins/ rather than core/.
//
// cli, devenv, fleetsim and the end-to-end tests import it; nothing below
// them does.
package daemon
