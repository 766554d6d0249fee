#!/bin/sh
# nginx with the conf.d file the compose file gives the gateway. That file names Docker's
# embedded DNS server (127.0.0.11); under podman the name server of a compose network is
# aardvark-dns at the network's gateway address, the one in /etc/resolv.conf: use that one.
set -eu
conf=/etc/nginx/conf.d/default.conf
ns=$(awk '$1 == "nameserver" { print $2; exit }' /etc/resolv.conf)
if [ -n "$ns" ] && [ "$ns" != 127.0.0.11 ] && grep -q 'resolver 127\.0\.0\.11' "$conf"; then
  sed "s/resolver 127\.0\.0\.11/resolver $ns/" "$conf" >/tmp/default.conf
  sed -i "s#include /etc/nginx/conf.d/\*.conf;#include /tmp/default.conf;#" /etc/nginx/nginx.conf
fi
exec nginx -g 'daemon off;'
