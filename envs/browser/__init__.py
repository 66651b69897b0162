"""The browser family: an in-process shop shown as a text accessibility tree with element ids
(search, filters, pagination, product pages with options, cart and checkout, an account with
orders, addresses and contact details). Buy the product that matches a description within a
budget, answer a question from the site's pages, change the account, or report that the task
cannot be done on this site."""

from gymfoundry.envs.family import Family

from .facts import BrowserFacts
from .generator import GENERATOR_VERSION, generate
from .policy import ScriptedBrowserPolicy
from .verifier import BrowserVerifier
from .world import BrowserEnv

FAMILY = Family(
    name="browser", env=BrowserEnv, generator=generate, generator_version=GENERATOR_VERSION,
    facts=BrowserFacts, verifier=BrowserVerifier, scripted_policy=ScriptedBrowserPolicy)
generate_task = FAMILY.generate

__all__ = ["FAMILY", "GENERATOR_VERSION", "BrowserEnv", "generate_task"]
