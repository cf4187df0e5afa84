"""The small web application browser traces replay against, served on loopback only.

A browser agent's traces name pages of sites we must not (and cannot) reach, so the browser
tenant replays them against this site instead: every URL is rewritten to this server, keeping its
path and query. It has what the shipped traces exercise — pages and navigation (home, docs, a
paginated catalogue, item pages), forms (sign in with a session cookie, search, add to cart,
checkout) and one heavy page (`/report`: a large table plus in-page JavaScript work, so a step can
cost the browser real memory and CPU). Unknown paths get a small 404 page with a link home, so a
trace that names a page we do not have still loads something.

    agentcgroup tools webapp            # serve on 127.0.0.1, an ephemeral port

State (sessions, carts, orders) is kept per server, in memory. Binds 127.0.0.1 only.
"""
from __future__ import annotations

import html
import itertools
import secrets
import threading
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

LOOPBACK = "127.0.0.1"
USERS = {"agent": "correct-horse", "alice": "wonderland"}
ITEMS = [{"id": i, "name": f"{adj} {noun}", "price": 3 + (i * 7) % 40}
         for i, (adj, noun) in enumerate(itertools.product(
             ("Red", "Blue", "Quiet", "Fast", "Tiny", "Heavy"),
             ("Widget", "Gadget", "Sprocket", "Lantern", "Notebook")), 1)]
PAGE_SIZE = 8
DOCS = [("intro", "Getting started"), ("install", "Installation"), ("api", "API reference"),
        ("faq", "Frequently asked questions")]
MAX_REPORT_ROWS = 20000
MAX_BODY = 64 * 1024

_STYLE = """body{font-family:'Liberation Sans',sans-serif;max-width:52em;margin:1em auto;padding:0 1em}
nav a{margin-right:1em} table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:2px 6px}
.error{color:#a00} .item{margin:.3em 0}"""


def page(title: str, body: str, *, user: str | None = None) -> bytes:
    who = (f'<span id="user">Signed in as {html.escape(user)}</span> <a href="/logout">Sign out</a>'
           if user else '<a href="/login">Sign in</a>')
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><nav><a href=\"/\">Home</a><a href=\"/docs/\">Docs</a>"
            f"<a href=\"/catalogue\">Catalogue</a><a href=\"/search\">Search</a><a href=\"/cart\">Cart</a>{who}</nav>"
            f"<main><h1>{html.escape(title)}</h1>{body}</main></body></html>").encode()


class Site:
    """Per-server state. All access under one lock: the handler threads share it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sessions: dict[str, dict] = {}
        self.orders = itertools.count(1000)

    def session(self, sid: str | None) -> dict | None:
        with self.lock:
            return self.sessions.get(sid) if sid else None

    def new_session(self, user: str | None) -> str:
        sid = secrets.token_hex(16)
        with self.lock:
            self.sessions[sid] = {"user": user, "cart": []}
        return sid


class Handler(BaseHTTPRequestHandler):
    server_version = "agentcgroup-webapp/1"
    protocol_version = "HTTP/1.1"
    site: Site

    def log_message(self, fmt, *args):     # quiet: a replay makes hundreds of requests
        pass

    # -- plumbing --------------------------------------------------------------------------------
    def _sid(self) -> str | None:
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        return cookie["sid"].value if "sid" in cookie else None

    def _state(self) -> dict | None:
        return self.site.session(self._sid())

    def _user(self) -> str | None:
        st = self._state()
        return st["user"] if st else None

    def _send(self, status: int, body: bytes, *, ctype="text/html; charset=utf-8", headers=()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _redirect(self, to: str, *, headers=()) -> None:
        self._send(HTTPStatus.SEE_OTHER, b"", headers=(("Location", to), *headers))

    def _form(self) -> dict[str, str]:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError("form too large")
        data = self.rfile.read(n).decode("utf-8", "replace")
        return {k: v[0] for k, v in parse_qs(data, keep_blank_values=True).items()}

    def _ensure_session(self) -> tuple[dict, list]:
        """The caller's session, made on first use; the headers that set its cookie."""
        st = self._state()
        if st is not None:
            return st, []
        sid = self.site.new_session(None)
        return self.site.session(sid), [("Set-Cookie", f"sid={sid}; Path=/; HttpOnly; SameSite=Lax")]

    # -- routes ----------------------------------------------------------------------------------
    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        user = self._user()
        if path in ("/", "/index.html"):
            body = ('<p id="intro">A small shop and its documentation, served on loopback for replayed '
                    'browser traces.</p><ul><li><a href="/docs/">Read the docs</a></li>'
                    '<li><a href="/catalogue">Browse the catalogue</a></li>'
                    '<li><a href="/report">Open the sales report</a></li></ul>'
                    '<div id="status" class="status">ready</div>')
            return self._send(200, page("Welcome", body, user=user))
        if path == "/favicon.ico":
            return self._send(204, b"", ctype="image/x-icon")
        if path in ("/docs", "/docs/"):
            items = "".join(f'<li><a href="/docs/{slug}">{html.escape(t)}</a></li>' for slug, t in DOCS)
            return self._send(200, page("Docs", f"<ul id=toc>{items}</ul>", user=user))
        if path.startswith("/docs/"):
            slug = path[len("/docs/"):]
            idx = next((i for i, (s, _) in enumerate(DOCS) if s == slug), None)
            if idx is None:
                return self._not_found(user)
            nxt = (f'<a id="next" href="/docs/{DOCS[idx + 1][0]}">Next: {html.escape(DOCS[idx + 1][1])}</a>'
                   if idx + 1 < len(DOCS) else '<a id="next" href="/docs/">Back to contents</a>')
            paras = "".join(f"<p>Section {idx + 1}.{n}: {html.escape(DOCS[idx][1])} — paragraph {n}.</p>"
                            for n in range(1, 13))
            return self._send(200, page(DOCS[idx][1], paras + nxt, user=user))
        if path == "/login":
            return self._send(200, page("Sign in", self._login_form(q.get("error")), user=user))
        if path == "/logout":
            return self._redirect("/", headers=(("Set-Cookie", "sid=; Path=/; Max-Age=0"),))
        if path == "/account":
            if not user:
                return self._redirect("/login?error=Please+sign+in")
            st = self._state()
            return self._send(200, page("Your account", f'<p id="welcome">Welcome back, {html.escape(user)}.</p>'
                                        f'<p>Items in cart: <span id="cart-count">{len(st["cart"])}</span></p>',
                                        user=user))
        if path == "/search":
            return self._send(200, page("Search", self._search(q.get("q", "")), user=user))
        if path == "/catalogue":
            return self._send(200, page("Catalogue", self._catalogue(q.get("page", "1")), user=user))
        if path.startswith("/item/"):
            item = self._item(path[len("/item/"):])
            if item is None:
                return self._not_found(user)
            body = (f'<p id="price">Price: ${item["price"]}</p><form method="post" action="/cart">'
                    f'<input type="hidden" name="item" value="{item["id"]}">'
                    '<label>Quantity <input id="qty" name="qty" type="number" value="1" min="1" max="99"></label>'
                    '<button id="add" type="submit">Add to cart</button></form>')
            return self._send(200, page(item["name"], body, user=user))
        if path == "/cart":
            return self._send(200, page("Cart", self._cart(), user=user))
        if path.startswith("/order/"):
            return self._send(200, page("Order placed", f'<p id="order">Order {html.escape(path[7:])} confirmed.</p>',
                                        user=user))
        if path == "/report":
            return self._send(200, page("Sales report", self._report(q.get("rows", "2000")), user=user))
        return self._not_found(user)

    def do_POST(self):
        path = urlsplit(self.path).path
        try:
            form = self._form()
        except ValueError:
            return self._send(413, page("Too large", "<p>Form too large.</p>"))
        if path == "/login":
            name, pw = form.get("username", ""), form.get("password", "")
            if USERS.get(name) != pw:
                return self._redirect("/login?error=Wrong+user+name+or+password")
            sid = self.site.new_session(name)
            return self._redirect("/account", headers=(("Set-Cookie", f"sid={sid}; Path=/; HttpOnly; SameSite=Lax"),))
        if path == "/cart":
            st, headers = self._ensure_session()
            item = self._item(form.get("item", ""))
            qty = form.get("qty", "1")
            if item is not None and qty.isdigit() and 0 < int(qty) < 100:
                with self.site.lock:
                    st["cart"].append((item["id"], int(qty)))
            return self._redirect("/cart", headers=headers)
        if path == "/checkout":
            st = self._state()
            if not st or not st["cart"] or not form.get("address", "").strip():
                return self._redirect("/cart")
            with self.site.lock:
                st["cart"].clear()
            return self._redirect(f"/order/{next(self.site.orders)}")
        return self._not_found(self._user())

    # -- page bodies -----------------------------------------------------------------------------
    def _not_found(self, user):
        self._send(404, page("Not found", '<p>No such page. <a id="home" href="/">Go home</a></p>', user=user))

    @staticmethod
    def _login_form(error: str | None) -> str:
        err = f'<p class="error" id="error">{html.escape(error)}</p>' if error else ""
        return (err + '<form method="post" action="/login">'
                '<label>User name <input id="username" name="username" autocomplete="username"></label><br>'
                '<label>Password <input id="password" name="password" type="password"></label><br>'
                '<label><input id="remember" name="remember" type="checkbox"> Remember me</label><br>'
                '<button id="signin" type="submit">Sign in</button></form>')

    @staticmethod
    def _item(raw: str) -> dict | None:
        return ITEMS[int(raw) - 1] if raw.isdigit() and 0 < int(raw) <= len(ITEMS) else None

    @staticmethod
    def _search(query: str) -> str:
        form = (f'<form method="get" action="/search"><input id="q" name="q" value="{html.escape(query)}" '
                'placeholder="Search the catalogue"><button id="go" type="submit">Search</button></form>')
        if not query:
            return form
        hits = [it for it in ITEMS if query.lower() in it["name"].lower()]
        rows = "".join(f'<li class="item"><a href="/item/{it["id"]}">{html.escape(it["name"])}</a></li>' for it in hits)
        return form + f'<p id="count">{len(hits)} result(s)</p><ul id="results">{rows}</ul>'

    @staticmethod
    def _catalogue(raw: str) -> str:
        pages = (len(ITEMS) + PAGE_SIZE - 1) // PAGE_SIZE
        n = min(max(int(raw), 1), pages) if raw.isdigit() else 1
        rows = "".join(f'<li class="item"><a href="/item/{it["id"]}">{html.escape(it["name"])}</a> ${it["price"]}</li>'
                       for it in ITEMS[(n - 1) * PAGE_SIZE:n * PAGE_SIZE])
        nav = (f'<a id="prev" href="/catalogue?page={n - 1}">Previous</a> ' if n > 1 else "") + \
              (f'<a id="next" href="/catalogue?page={n + 1}">Next</a>' if n < pages else "")
        return f'<p>Page <span id="page">{n}</span> of {pages}</p><ul id="items">{rows}</ul>{nav}'

    def _cart(self) -> str:
        st = self._state()
        lines = st["cart"] if st else []
        if not lines:
            return '<p id="empty">Your cart is empty.</p>'
        rows = "".join(f"<li class=item>{html.escape(ITEMS[i - 1]['name'])} × {n}</li>" for i, n in lines)
        total = sum(ITEMS[i - 1]["price"] * n for i, n in lines)
        return (f'<ul id="lines">{rows}</ul><p>Total: $<span id="total">{total}</span></p>'
                '<form method="post" action="/checkout"><label>Address <input id="address" name="address"></label>'
                '<button id="checkout" type="submit">Place order</button></form>')

    @staticmethod
    def _report(raw: str) -> str:
        rows = min(int(raw), MAX_REPORT_ROWS) if raw.isdigit() else 2000
        body = "".join(f"<tr><td>{r}</td><td>{ITEMS[r % len(ITEMS)]['name']}</td><td>{(r * 37) % 997}</td></tr>"
                       for r in range(rows))
        # In-page work a real dashboard does: sort and aggregate the table, draw a chart.
        script = """
const cells=[...document.querySelectorAll('#sales td:nth-child(3)')].map(td=>+td.textContent);
const sorted=[...cells].sort((a,b)=>a-b), buckets=new Array(60).fill(0);
for(const v of cells) buckets[Math.floor(v/997*60)]++;
const c=document.getElementById('chart').getContext('2d'), m=Math.max(...buckets,1);
buckets.forEach((b,i)=>c.fillRect(i*10,200-b/m*200,8,b/m*200));
document.getElementById('median').textContent=sorted[sorted.length>>1]??'-';"""
        return (f'<p>Rows: {rows}; median: <span id="median">…</span></p>'
                '<canvas id="chart" width="600" height="200"></canvas>'
                f'<table id="sales"><tr><th>#</th><th>item</th><th>amount</th></tr>{body}</table>'
                f'<script>{script}</script>')


def serve(host: str = LOOPBACK, port: int = 0) -> ThreadingHTTPServer:
    """Start the site on host:port (0: ephemeral) in a daemon thread. `server.shutdown()` and
    `server.server_close()` stop it; `server.url` is its base URL."""
    if host != LOOPBACK:
        raise ValueError(f"the web app serves loopback only ({LOOPBACK}), not {host!r}")
    handler = type("SiteHandler", (Handler,), {"site": Site()})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.url = f"http://{host}:{server.server_port}"
    threading.Thread(target=server.serve_forever, name="webapp", daemon=True).start()
    return server
