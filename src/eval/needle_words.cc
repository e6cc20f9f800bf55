#include "eval/needle_words.h"

namespace sieve::eval {

namespace {

// Capitalised names and nouns that stand out in ordinary prose: a key is one of them.
constexpr std::string_view kKeys[] = {
    "Marlow",     "Quince",     "Obsidian",   "Juniper",    "Falcon",     "Saffron",   "Tamarind",
    "Halcyon",    "Vesper",     "Corvin",     "Basalt",     "Thistle",    "Wren",      "Larkspur",
    "Calloway",   "Pemberton",  "Ashgrove",   "Bramble",    "Cobalt",     "Dunmore",   "Ember",
    "Fennick",    "Garnet",     "Hollis",     "Indigo",     "Jasper",     "Kestrel",   "Lomax",
    "Mistral",    "Nettle",     "Oberon",     "Pollux",     "Quarry",     "Rook",      "Sable",
    "Tarragon",   "Umber",      "Vireo",      "Wickham",    "Yarrow",     "Zephyr",    "Alder",
    "Beacon",     "Cinder",     "Draper",     "Elgin",      "Foxglove",   "Gable",     "Heron",
    "Ivor",       "Jubilee",    "Kingsley",   "Lantern",    "Merrick",    "Norrow",    "Orchid",
    "Pickett",    "Quill",      "Rowan",      "Sterling",   "Thackeray",  "Upton",     "Valerian",
    "Winslow",    "Xander",     "Yardley",    "Zinnia",     "Anvil",      "Bellamy",   "Caspian",
    "Delphine",   "Everly",     "Fairbanks",  "Grimsby",    "Harrow",     "Ingram",    "Jessop",
    "Kilbride",   "Lindqvist",  "Montague",   "Nightshade", "Ottoline",   "Peregrine", "Quorra",
    "Ravenna",    "Sorrel",     "Tolliver",   "Ulric",      "Vantage",    "Whitlock",  "Yeoman",
    "Zanzibar",   "Amberley",   "Birchwood",  "Carraway",   "Dovetail",   "Eastwick",  "Fenwick",
    "Greystone",  "Holloway",   "Isolde",     "Juxon",      "Kittering",  "Lavender",  "Moorcroft",
    "Northcote",  "Oakhurst",   "Prentice",   "Quimby",     "Redfern",    "Saltmarsh", "Thornbury",
    "Underhill",  "Verity",     "Westbrook",  "Yelverton",  "Zeller",     "Albatross", "Blackthorn",
    "Cormorant",  "Dragonfly",  "Eiderdown",  "Firecrest",  "Gannet",     "Hawthorn",  "Ibis",
    "Jackdaw",    "Kingfisher", "Lapwing",    "Magpie",     "Nightjar",   "Osprey",    "Pipit",
    "Quetzal",    "Redstart",   "Skylark",    "Turnstone",  "Vulture",    "Waxwing",   "Cardamom",
    "Nutmeg",     "Sassafras",  "Chicory",    "Fenugreek",  "Galangal",   "Hyssop",    "Lovage",
    "Mugwort",    "Pimento",    "Rosemary",   "Sumac",      "Tansy",      "Vetiver",   "Wormwood",
    "Andromeda",  "Bellatrix",  "Capella",    "Deneb",      "Electra",    "Fomalhaut", "Hadar",
    "Izar",       "Lyra",       "Mira",       "Nashira",    "Orion",      "Polaris",   "Rigel",
    "Sirius",     "Thuban",     "Vega",       "Arbuthnot",  "Blakeney",   "Crabtree",  "Dashwood",
    "Ellery",     "Farthing",   "Gosling",    "Hargreave",  "Inchbald",   "Jolliffe",  "Kimberly",
    "Loxley",     "Marchbank",  "Nethercott", "Oldfield",   "Partridge",  "Quennell",  "Rattigan",
    "Shackleton", "Trelawny",   "Urquhart",   "Vickery",    "Wainwright",
};

// Common concrete English words, lowercase: a value is several of them.
constexpr std::string_view kValueWords[] = {
    "apple",    "river",    "stone",      "table",    "window",   "garden",    "candle",  "bridge",
    "mountain", "pencil",   "basket",     "ladder",   "mirror",   "button",    "blanket", "bottle",
    "cabbage",  "carpet",   "castle",     "cherry",   "cloud",    "copper",    "cotton",  "cradle",
    "crayon",   "desert",   "dinner",     "dragon",   "drum",     "eagle",     "engine",  "feather",
    "fence",    "finger",   "forest",     "fountain", "frog",     "glove",     "goat",    "grape",
    "hammer",   "harbor",   "helmet",     "honey",    "horse",    "island",    "jacket",  "jelly",
    "kettle",   "kitten",   "lemon",      "letter",   "lizard",   "meadow",    "melon",   "monkey",
    "needle",   "ocean",    "onion",      "orange",   "oven",     "paddle",    "paper",   "parrot",
    "peach",    "pebble",   "pepper",     "piano",    "pillow",   "planet",    "pocket",  "pony",
    "potato",   "puddle",   "pumpkin",    "puppy",    "rabbit",   "radio",     "rainbow", "ribbon",
    "robot",    "rocket",   "saddle",     "sailor",   "scarf",    "shadow",    "sheep",   "shell",
    "shovel",   "silver",   "sock",       "spoon",    "squirrel", "star",      "stove",   "sugar",
    "sweater",  "tiger",    "tomato",     "tower",    "tractor",  "tree",      "trumpet", "tunnel",
    "turtle",   "umbrella", "valley",     "violin",   "wagon",    "walnut",    "whistle", "willow",
    "wizard",   "wool",     "yellow",     "zebra",    "acorn",    "anchor",    "arrow",   "attic",
    "bakery",   "balloon",  "bamboo",     "banana",   "barrel",   "beetle",    "bell",    "berry",
    "biscuit",  "blossom",  "boat",       "bonnet",   "branch",   "bread",     "brick",   "broom",
    "bucket",   "butter",   "cactus",     "camel",    "canoe",    "carrot",    "cave",    "chalk",
    "chimney",  "clock",    "coconut",    "comet",    "compass",  "cookie",    "corner",  "crown",
    "cushion",  "daisy",    "dolphin",    "donkey",   "dust",     "elbow",     "emerald", "fairy",
    "fiddle",   "flag",     "flame",      "flour",    "flute",    "garage",    "ginger",  "giraffe",
    "glacier",  "globe",    "gravel",     "guitar",   "hedge",    "hill",      "hook",    "igloo",
    "ink",      "jam",      "jar",        "jungle",   "key",      "kite",      "ladle",   "lamp",
    "lantern",  "leaf",     "lighthouse", "lion",     "marble",   "mitten",    "moon",    "moss",
    "mushroom", "nest",     "noodle",     "nut",      "oak",      "owl",       "paint",   "panda",
    "parcel",   "path",     "peanut",     "penguin",  "pie",      "pig",       "pine",    "plum",
    "pond",     "porch",    "quilt",      "raft",     "rain",     "reed",      "ring",    "road",
    "roof",     "rope",     "rose",       "salt",     "sand",     "scooter",   "seed",    "shoe",
    "silk",     "sled",     "slipper",    "snail",    "snow",     "soap",      "soup",    "sparrow",
    "spider",   "sponge",   "stamp",      "stream",   "string",   "sunflower", "swan",    "swing",
    "teapot",   "tent",     "thimble",    "thread",   "thunder",  "toast",     "towel",   "toy",
    "train",    "trolley",  "tulip",      "vase",     "velvet",   "wheel",     "whale",   "wind",
    "wing",     "wire",     "yarn",       "yogurt",   "ash",      "beach",     "bench",   "candy",
    "chair",    "cliff",    "crab",       "deer",     "fog",      "fox",       "gate",    "hat",
    "ice",      "kiwi",     "lake",       "map",      "milk",     "mouse",     "pear",    "rice",
    "rug",      "seal",     "ship",       "sofa",     "tape",     "toad",      "van",     "wax",
    "web",      "wolf",     "orchard",    "harvest",  "lagoon",   "meteor",
};

}  // namespace

std::span<const std::string_view> needle_keys() { return kKeys; }
std::span<const std::string_view> needle_value_words() { return kValueWords; }

}  // namespace sieve::eval
