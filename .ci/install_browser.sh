#!/usr/bin/env bash
# Installs what tests/test_demo_e2e.py needs: Debian's chromium (Playwright's own browser download cannot work
# here) and the pinned gradio + playwright wheels. Never fails: without them the e2e test skips and says why.
set -u

PIP="${PIP:-python -m pip}"

if [ ! -x /usr/bin/chromium ]; then
    if command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq chromium; } >/tmp/install_browser_apt.log 2>&1 \
            || echo "install_browser: apt-get could not install chromium (see /tmp/install_browser_apt.log); the demo e2e test will skip"
    else
        echo "install_browser: no apt-get; the demo e2e test will skip unless /usr/bin/chromium exists"
    fi
fi

$PIP install -q "gradio==6.31.0" "playwright==1.65.2" \
    || echo "install_browser: pip could not install gradio/playwright; the demo e2e test will skip"
exit 0
