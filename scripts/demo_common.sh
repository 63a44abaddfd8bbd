# What `make demo` (scripts/demo.sh) and `make demo-dflash` (scripts/demo_dflash.sh) share: the
# step headings, the demo's policy and its way into the registry as the policy of record. Sourced,
# with DEMO_DIR and SPECREG_HOME set.

# each step says how long the demo has run so far (m:ss), so a slow step shows where it is
step() { printf '\n== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# The built-in policy validates on the 43-prompt default set; the demo uses the 7-prompt
# smoke set so that it runs in a few minutes on a laptop CPU.
write_demo_policy() {  # FILE
  cat > "$1" <<'TOML'
golden_set = "smoke"
required_checks = ["integrity", "tokenizer", "chat_template", "equivalence", "distribution", "acceptance"]
acceptance_tolerance = 0.10
max_validation_age_days = 30

[required_checks_by_method]
# a head drafts inside the target's own chat context: no second template to compare (the
# tokenizer check is the head's fit to the target's vocabulary)
eagle3 = ["integrity", "tokenizer", "equivalence", "distribution", "acceptance"]
dflash = ["integrity", "tokenizer", "equivalence", "distribution", "acceptance"]
mtp = ["integrity", "tokenizer", "equivalence", "distribution", "acceptance"]

[environments.staging]
approval_required = false

[keyring]
enrollers = ["admin"]   # who may enrol an approver's public key

[environments.production]
approval_required = true
approvers = ["bob"]
min_acceptance_rate = 0.3   # as the built-in policy: no first baseline a draft rarely matches
min_speedup = 1.0           # never slower than the target alone (or promote --allow-slower REASON)
TOML
}

# The policy governs from the registry, not from a file the caller names: alice proposes the demo's
# policy and bob, whose key an enroller (admin) put in the keyring, approves it (four-eyes under the
# built-in policy in effect until then). Every later command is judged under it.
policy_of_record() {  # FILE KEYS_DIR (a fresh folder for bob's key pair)
  step "the team's policy of record: alice proposes the demo policy, bob approves it with his own key"
  write_demo_policy "$1"
  specreg keys create --use approval --out "$2/bob"                                 # bob's own key pair
  specreg keys enrol bob --public-key "$2/bob/specreg-signing.pub" --user admin   # an enroller, audited
  export SPECREG_APPROVAL_KEY="$2/bob/specreg-signing.key"
  specreg policy propose "$1" --note "demo: the smoke golden set, bob approves production"
  specreg policy approve 1 --user bob --note "reviewed"
  specreg policy show | sed -n 1p  # sed reads it all: head would close the pipe early (BrokenPipeError, exit 1 under pipefail)
}
