#!/bin/sh
# nginx with the configuration the compose file mounts (conf.d/default.conf, serving/workers.conf,
# tls/). It names Docker's embedded DNS server (127.0.0.11); under podman the name server of a
# compose network is aardvark-dns at the network's gateway address, the one in
# /etc/resolv.conf. The mounts are read-only: run from a copy of /etc/nginx that names it.
set -eu
ns=$(awk '$1 == "nameserver" { print $2; exit }' /etc/resolv.conf)
if [ -n "$ns" ] && [ "$ns" != 127.0.0.11 ] && grep -rqs 'resolver 127\.0\.0\.11' /etc/nginx/conf.d /etc/nginx/serving; then
  rm -rf /tmp/nginx
  cp -rL /etc/nginx /tmp/nginx
  find /tmp/nginx -name '*.conf' -exec sed -i -e "s/resolver 127\.0\.0\.11/resolver $ns/" -e 's#/etc/nginx/#/tmp/nginx/#g' {} +
  exec nginx -c /tmp/nginx/nginx.conf -g 'daemon off;'
fi
exec nginx -g 'daemon off;'
